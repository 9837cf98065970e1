package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkAddedTTFT: the front's own added time to first byte at 32 concurrent streams, side
// by side with going direct to the same incumbent (an in-process SSE stand-in: first event at
// once, then 16 more 2 ms apart), without the mirror's shadow side. Not run by `go test`:
//
//	go test -run '^$' -bench AddedTTFT -benchtime 1x
func BenchmarkAddedTTFT(b *testing.B) {
	event := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"},\"finish_reason\":null}]}\n\n"
	inc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 17; i++ {
			if i > 0 {
				time.Sleep(2 * time.Millisecond)
			}
			_, _ = w.Write([]byte(event))
			w.(http.Flusher).Flush()
		}
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
	}))
	defer inc.Close()
	t := &testing.T{}
	h := start(t, inc.URL, func(c *config) { c.TeeQueue, c.IncumbentMaxConnections = 1<<16, 0 }, false)
	go func() { // the tee's frames are read and dropped
		for range h.tee.frames {
		}
	}()
	const conc, perStream, rounds = 32, 20, 3
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * conc, DisableCompression: true}}
	run := func(url string) []float64 {
		var mu sync.Mutex
		var ttft []float64
		var wg sync.WaitGroup
		for i := 0; i < conc; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				one := make([]byte, 1)
				for j := 0; j < perStream; j++ {
					t0 := time.Now()
					resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.ReadFull(resp.Body, one)
					d := time.Since(t0).Seconds() * 1000
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					ttft = append(ttft, d)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return ttft
	}
	pct := func(xs []float64, p float64) float64 {
		sort.Float64s(xs)
		return xs[min(len(xs)-1, int(p*float64(len(xs))))]
	}
	for n := 0; n < b.N; n++ {
		var direct, front []float64
		run(inc.URL) // warm-up: connections
		run(h.url)
		for r := 0; r < rounds; r++ { // interleaved rounds
			direct = append(direct, run(inc.URL)...)
			front = append(front, run(h.url)...)
		}
		d50, d99, f50, f99 := pct(direct, 0.5), pct(direct, 0.99), pct(front, 0.5), pct(front, 0.99)
		b.ReportMetric(f50-d50, "added-ttft-p50-ms")
		b.ReportMetric(f99-d99, "added-ttft-p99-ms")
		fmt.Printf("%d streams, %d requests a path: TTFT ms direct p50 %.2f p99 %.2f, front p50 %.2f p99 %.2f\n",
			conc, len(direct), d50, d99, f50, f99)
	}
	close(h.stop)
	<-h.done
}

// BenchmarkPerChunk: the front's per-chunk and per-answer work, each beside what it replaced:
// the finish_reason check of every chunk (a scan against mirror/sse.py's regexp) and an end
// frame of 20 chunks (by hand against encoding/json). Not run by `go test`:
//
//	go test -run '^$' -bench PerChunk -benchmem
func BenchmarkPerChunk(b *testing.B) {
	event := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	finish := keyThenCases[3]
	b.Run("finish-check/regexp", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_ = finish.re.Match(event)
		}
	})
	b.Run("finish-check/scan", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_ = keyThen(event, finish.key, finish.then, finish.raw)
		}
	})
	lt, code := 0.5, 200
	end := &endFrame{K: "end", ID: 17, Status: "ok", HTTPStatus: &code, ClientCode: 200, SSE: true, Parts: [][]byte{}, LastT: &lt}
	for i := 0; i < 20; i++ {
		end.Chunks = append(end.Chunks, chunk{0.04 + 0.008*float64(i), event})
	}
	b.Run("end-frame/encoding-json", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_, _ = json.Marshal(end)
		}
	})
	b.Run("end-frame/by-hand", func(b *testing.B) {
		var buf []byte
		for i := 0; i < b.N; i++ {
			buf = end.appendJSON(buf[:0])
		}
	})
}
