package main

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// hide runs a stream through a usageHider in pieces of step bytes, as the front does per chunk.
func hide(stream []byte, step int) ([]byte, *usageHider) {
	h := &usageHider{}
	var out []byte
	for i := 0; i < len(stream); i += step {
		end := min(i+step, len(stream))
		out = append(out, h.feed(stream[i:end], float64(i))...)
	}
	return append(out, h.close(float64(len(stream)))...), h
}

// testdata/*_usage.sse are streams as engines write them with include_usage (made by
// tests/mirror/test_mirror_sse.py's builders); *_usage.hidden is what mirror.sse.UsageHider gives
// the client for each. The port must give the same bytes however the stream is split.
func TestUsageHiderMatchesPythonAtEverySplit(t *testing.T) {
	files, _ := filepath.Glob("testdata/*_usage.sse")
	if len(files) < 12 {
		t.Fatalf("testdata: %d streams, want 12", len(files))
	}
	for _, f := range files {
		stream, _ := os.ReadFile(f)
		want, err := os.ReadFile(strings.TrimSuffix(f, ".sse") + ".hidden")
		if err != nil {
			t.Fatal(err)
		}
		for step := 1; step <= len(stream); step++ {
			got, h := hide(stream, step)
			if !bytes.Equal(got, want) {
				t.Fatalf("%s split every %d bytes:\n got %q\nwant %q", f, step, got, want)
			}
			if h.holding() {
				t.Fatalf("%s: still holding after close", f)
			}
			if stamped := strings.Contains(f, "stamped"); (h.heldS == nil) != stamped {
				t.Fatalf("%s: heldS %v", f, h.heldS)
			}
		}
		// vLLM 0.32: the client gets the stream it would have had without include_usage
		if plain, err := os.ReadFile(strings.Replace(f, "_usage.sse", "_plain.sse", 1)); err == nil &&
			strings.Contains(f, "vllm032") && !bytes.Equal(want, plain) {
			t.Fatalf("%s: the hidden stream is not the plain one", f)
		}
	}
}

func TestUsageHiderHoldsAFinishEventUntilTheUsageEvent(t *testing.T) {
	stream, _ := os.ReadFile("testdata/vllm032_chat_n1_usage.sse")
	ev := bytes.Split(stream, []byte("\n\n"))
	token, finish, usage, end := ev[0], ev[1], ev[2], ev[3]
	nn := func(b []byte) []byte { return append(append([]byte{}, b...), '\n', '\n') }
	h := &usageHider{}
	if got := h.feed(nn(token), 1); !bytes.Equal(got, nn(token)) {
		t.Fatalf("token: %q", got)
	}
	if got := h.feed(nn(finish), 2); len(got) != 0 || !h.holding() {
		t.Fatalf("finish not held: %q", got)
	}
	fp := []byte(`,"system_fingerprint":"vllm-0.32.0-6549002a"`)
	if got := h.feed(nn(usage), 2.5); !bytes.Equal(got, addField(nn(finish), fp)) {
		t.Fatalf("release: %q", got)
	}
	if h.heldS == nil || *h.heldS != 0.5 {
		t.Fatalf("heldS %v", h.heldS)
	}
	if got := h.feed(nn(end), 3); !bytes.Equal(got, nn(end)) || len(h.close(3)) != 0 {
		t.Fatalf("done: %q", got)
	}
}

func TestSSEHelpers(t *testing.T) {
	yes := func(s string) []byte { return []byte(s) }
	if isUsageOnly(yes(`{"choices":[{"index":0}],"usage":{"completion_tokens":1}}`), true) ||
		isUsageOnly(yes(`{"choices":[],"usage":null}`), true) ||
		isUsageOnly(yes(`{"note":"\"usage\" \"choices\""}`), true) ||
		!isUsageOnly(yes(`{"choices": [], "usage": {"completion_tokens": 1}}`), true) {
		t.Fatal("isUsageOnly")
	}
	if decodeData(yes("[DONE]"), true) != nil || decodeData(yes("not json"), true) != nil ||
		decodeData(yes("[1, 2]"), true) != nil || decodeData(nil, false) != nil {
		t.Fatal("decodeData")
	}
	if got := fingerprintField(yes(`{"choices":[],"usage":{},"system_fingerprint":"a\"b"}`), true); string(got) != `,"system_fingerprint":"a\"b"` {
		t.Fatalf("fingerprint %q", got)
	}
	if got := fingerprintField(yes(`{"choices": [], "system_fingerprint": "v"}`), true); string(got) != `, "system_fingerprint": "v"` {
		t.Fatalf("fingerprint %q", got)
	}
	if fingerprintField(yes(`{"choices":[],"usage":{},"system_fingerprint":null}`), true) != nil ||
		fingerprintField(yes(`{"choices":[],"usage":{}}`), true) != nil {
		t.Fatal("fingerprint without a string")
	}
	if !finishesWithoutFingerprint(yes(`{"choices":[{"finish_reason":"stop"}]}`), true) ||
		finishesWithoutFingerprint(yes(`{"choices":[{"finish_reason":null}]}`), true) ||
		finishesWithoutFingerprint(yes(`{"choices":[{"finish_reason":"stop"}],"system_fingerprint":null}`), true) ||
		finishesWithoutFingerprint(yes(`{"choices":[{"delta":{"content":"\"finish_reason\":\""}}]}`), true) {
		t.Fatal("finishesWithoutFingerprint")
	}
	if string(addField(yes("data: {\"a\":1} \n\n"), yes(`,"b":2`))) != "data: {\"a\":1,\"b\":2} \n\n" ||
		string(addField(yes("data: [DONE]\n\n"), yes(`,"b":2`))) != "data: [DONE]\n\n" {
		t.Fatal("addField")
	}
	token := yes("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
	p := &sseParser{}
	if !passesWhole(p, token) || !passesWhole(p, append(append([]byte{}, token...), token...)) ||
		passesWhole(p, yes("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n")) ||
		passesWhole(p, yes("data: {\"choices\":\ndata: [],\"usage\":{}}\n\n")) ||
		passesWhole(p, token[:len(token)-1]) ||
		passesWhole(p, bytes.ReplaceAll(token, yes("\n"), yes("\r\n"))) ||
		passesWhole(&sseParser{}, yes("data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"finish_reason\":\"stop\"}]}\n\n")) {
		t.Fatal("passesWhole")
	}
	p.feed(yes("data: {"))
	if passesWhole(p, token) {
		t.Fatal("passesWhole with an event under way")
	}
}

func TestSSEParserFramings(t *testing.T) {
	p := &sseParser{}
	if ev := p.feed([]byte("data: x\r\n\r")); len(ev) != 0 {
		t.Fatal("trailing CR dispatched")
	}
	ev := p.feed([]byte("\ndata: y\n\n"))
	if len(ev) != 2 || string(ev[0].data) != "x" || string(ev[1].data) != "y" || string(ev[0].raw) != "data: x\r\n\r\n" {
		t.Fatalf("%+v", ev)
	}
	ev = (&sseParser{}).feed([]byte(": c\r\nevent: e\rdata: a\ndata\n\nid: 1\n\n"))
	if len(ev) != 2 || string(ev[0].data) != "a\n" || ev[0].event != "e" || ev[1].hasData {
		t.Fatalf("%+v", ev)
	}
	// the fast (LF) path and the general one agree, on random streams fed whole or byte by byte
	rng := rand.New(rand.NewSource(7))
	pieces := []string{"data: a", "data:b", "data", "event: e", ": c", "id: 1", "x", ""}
	ends := []string{"\n", "\n", "\n", "\r\n", "\r"}
	for range 300 {
		var s strings.Builder
		for range 1 + rng.Intn(12) {
			s.WriteString(pieces[rng.Intn(len(pieces))] + ends[rng.Intn(len(ends))])
		}
		stream := []byte(s.String())
		whole := &sseParser{}
		got := whole.feed(stream)
		bytewise := &sseParser{}
		var want []sseEvent
		for i := range stream {
			want = append(want, bytewise.feedAny(stream[i:i+1])...)
		}
		if len(got) != len(want) || !bytes.Equal(whole.pending(), bytewise.pending()) {
			t.Fatalf("%q: %d events vs %d", stream, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i].data, want[i].data) || got[i].hasData != want[i].hasData ||
				!bytes.Equal(got[i].raw, want[i].raw) || got[i].event != want[i].event {
				t.Fatalf("%q: event %d %+v vs %+v", stream, i, got[i], want[i])
			}
		}
	}
}

const ws, wsRaw = `[ \t\n\r\f\v]`, `(?:[ \t\n\r\f\v]|data:)`

// keyThenCases: keyThen's uses, each with the regexp of mirror/sse.py it stands for.
var keyThenCases = []struct {
	key, then string
	raw       bool
	re        *regexp.Regexp
}{
	{`"choices"`, ":[]", false, regexp.MustCompile(`"choices"` + ws + `*:` + ws + `*\[` + ws + `*\]`)},
	{`"choices"`, ":[]", true, regexp.MustCompile(`"choices"` + wsRaw + `*:` + wsRaw + `*\[` + wsRaw + `*\]`)},
	{`"finish_reason"`, `:"`, false, regexp.MustCompile(`"finish_reason"` + ws + `*:` + ws + `*"`)},
	{`"finish_reason"`, `:"`, true, regexp.MustCompile(`"finish_reason"` + wsRaw + `*:` + wsRaw + `*"`)},
}

// keyThen matches where mirror/sse.py's regexps match (their Go spelling is the reference).
func TestKeyThenIsTheRegexps(t *testing.T) {
	cases := keyThenCases
	pieces := []string{`"choices"`, `"finish_reason"`, ":", "[", "]", `"`, " ", "\n", "\v", "data:", "dat", "x", "null", "{", ","}
	rng := rand.New(rand.NewSource(2))
	for i := 0; i < 20000; i++ {
		var b []byte
		for j := rng.Intn(10); j >= 0; j-- {
			b = append(b, pieces[rng.Intn(len(pieces))]...)
		}
		for _, c := range cases {
			if got, want := keyThen(b, c.key, c.then, c.raw), c.re.Match(b); got != want {
				t.Fatalf("keyThen(%q, %s, %q, raw %v) = %v, the regexp says %v", b, c.key, c.then, c.raw, got, want)
			}
		}
	}
}
