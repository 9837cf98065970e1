package main

import (
	"encoding/json"
	"math/rand"
	"reflect"
	"testing"
)

// sameJSON: the hand-written frame decodes to what json.Marshal of its struct tags decodes to.
func sameJSON(t *testing.T, f frame) {
	t.Helper()
	want, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	got := f.appendJSON([]byte("stale bytes the writer's buffer held")[:0])
	var a, b any
	if err := json.Unmarshal(got, &a); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal(want, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("hand-written\n%s\nencoding/json\n%s", got, want)
	}
}

func TestTeeFramesJSONMatchesEncodingJSON(t *testing.T) {
	code, msg, tiny, big, wall := 200, "stream broke: \"EOF\"\n\x01 é \xff", 1e-7, 1e22, 1764680000.123456
	sameJSON(t, &reqFrame{K: "req", ID: 1})
	sameJSON(t, &reqFrame{
		K: "req", ID: 1<<64 - 1, Pair: "0190-ab", Route: "/v1/chat/completions", Path: `/v1/x?a="b"\c`,
		Headers: []header{{"host", "m"}, {"x-odd", "tab\there <&> \u2028 \xc3\x28"}}, Body: []byte{},
		TooLarge: true, Wall: wall, Dropped: -3,
	})
	sameJSON(t, &endFrame{K: "end", ID: 7, Status: "ok"})
	sameJSON(t, &endFrame{
		K: "end", ID: 7, Status: "connection_error", HTTPStatus: &code, ClientCode: 502, Error: &msg,
		SSE: true, Chunks: []chunk{{0, []byte("data: {}\n\n")}, {tiny, nil}, {big, []byte{0, 255}}},
		Parts: [][]byte{{}, []byte("x")}, LastT: &tiny, AddedS: &big, HeldS: &wall, Gone: true,
		SendTimeout: true, Dropped: 12,
	})
	sameJSON(t, &edgeFrame{K: "edge", Reason: edgeHeaderTimeout, Dropped: 1})

	rng := rand.New(rand.NewSource(1))
	text := func() string {
		b := make([]byte, rng.Intn(12))
		for i := range b {
			b[i] = byte(rng.Intn(256))
			if rng.Intn(3) > 0 {
				b[i] = byte(0x20 + rng.Intn(0x5f))
			}
		}
		return string(b)
	}
	num := func() float64 { return rng.NormFloat64() * []float64{1e-9, 1e-3, 1, 1e9, 1e25}[rng.Intn(5)] }
	for i := 0; i < 2000; i++ {
		e, n, s := text(), num(), rng.Intn(600)
		f := &endFrame{K: "end", ID: rng.Uint64(), Status: text(), ClientCode: s, HTTPStatus: &s, Error: &e, LastT: &n}
		for j := rng.Intn(4); j > 0; j-- {
			f.Chunks = append(f.Chunks, chunk{num(), []byte(text())})
			f.Parts = append(f.Parts, []byte(text()))
		}
		sameJSON(t, f)
		sameJSON(t, &reqFrame{K: "req", Pair: text(), Path: text(), Headers: []header{{text(), text()}}, Body: []byte(text()), Wall: num()})
	}
}
