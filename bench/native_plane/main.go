// A compiled reference for bench/mirror_overhead.py: what the mirror's per-request work costs
// in Go. Not a data plane of shadow-ab (it has none of the mirror's guard, limits, privacy,
// probes, spool or drain): a yardstick that says what a compiled plane could reach.
//
// Per request it does what the mirror's protocol plane does on its hot path: forwards the
// client's request to the incumbent and streams each chunk back as it arrives (flushed per
// chunk), sends a copy to the candidate and reads its answer to the end, notes every chunk's
// arrival time on both, parses both SSE streams after the end (JSON-decodes each event: text
// of choice 0, finish reason, usage), computes TTFT, ITL and E2E, builds one JSON record per
// side and hands the records to Kafka (franz-go, asynchronous produce, 100 ms linger) or, with
// no -kafka, drops them.
//
// With -off it only forwards (Go's own proxy_pass, for scale).
//
//	go run . -listen 127.0.0.1:PORT -incumbent http://H:P -candidate http://H:P [-kafka H:P -topic T] [-off]
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type chunk struct {
	at   time.Time
	data []byte
}

type event struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

type record struct {
	PairID           string          `json:"pair_id"`
	Role             string          `json:"role"`
	SentAt           time.Time       `json:"sent_at"`
	Status           int             `json:"http_status"`
	TTFT             *float64        `json:"ttft_s"`
	E2E              *float64        `json:"e2e_s"`
	ITL              []float64       `json:"itl_s"`
	PromptTokens     int             `json:"prompt_tokens"`
	CompletionTokens int             `json:"completion_tokens"`
	FinishReason     string          `json:"finish_reason"`
	OutputText       string          `json:"output_text"`
	Request          json.RawMessage `json:"request"`
}

var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

type plane struct {
	incumbent, candidate string
	client               *http.Client
	sink                 *kgo.Client
	topic                string
	shadowing            bool
}

func pairID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// trace parses a stream's chunks after its end into a record (the mirror's stream_trace).
func trace(pair, role string, sent time.Time, status int, req []byte, chunks []chunk) *record {
	r := &record{PairID: pair, Role: role, SentAt: sent, Status: status, Request: req}
	var text strings.Builder
	var last time.Time
	var pending []byte
	for _, c := range chunks {
		pending = append(pending, c.data...)
		for {
			i := bytes.Index(pending, []byte("\n\n"))
			if i < 0 {
				break
			}
			line := pending[:i]
			pending = pending[i+2:]
			data, ok := bytes.CutPrefix(line, []byte("data: "))
			if !ok || bytes.Equal(data, []byte("[DONE]")) {
				continue
			}
			var ev event
			if json.Unmarshal(data, &ev) != nil {
				continue
			}
			if ev.Usage != nil {
				r.PromptTokens, r.CompletionTokens = ev.Usage.PromptTokens, ev.Usage.CompletionTokens
			}
			if len(ev.Choices) == 0 {
				continue
			}
			t := c.at.Sub(sent).Seconds()
			if r.TTFT == nil {
				r.TTFT = &t
			} else {
				r.ITL = append(r.ITL, c.at.Sub(last).Seconds())
			}
			last = c.at
			r.E2E = &t
			text.WriteString(ev.Choices[0].Delta.Content)
			text.WriteString(ev.Choices[0].Text)
			if ev.Choices[0].FinishReason != nil {
				r.FinishReason = *ev.Choices[0].FinishReason
			}
		}
	}
	r.OutputText = text.String()
	return r
}

func (p *plane) send(r *record) {
	if p.sink == nil {
		return
	}
	value, err := json.Marshal(r)
	if err != nil {
		return
	}
	p.sink.Produce(context.Background(), &kgo.Record{Topic: p.topic, Key: []byte(r.PairID), Value: value}, nil)
}

func (p *plane) shadow(pair string, path string, header http.Header, body []byte) {
	req, err := http.NewRequest(http.MethodPost, p.candidate+path, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header = header.Clone()
	sent := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	var chunks []chunk
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			chunks = append(chunks, chunk{time.Now(), append([]byte(nil), buf[:n]...)})
		}
		if err != nil {
			break
		}
	}
	p.send(trace(pair, "candidate", sent, resp.StatusCode, body, chunks))
}

func (p *plane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		http.Error(w, "could not read the request body", http.StatusBadRequest)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.incumbent+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	for k, v := range r.Header {
		if !hopByHop[k] {
			req.Header[k] = v
		}
	}
	pair := pairID()
	shadowed := p.shadowing && r.Method == http.MethodPost
	if shadowed {
		go p.shadow(pair, r.URL.RequestURI(), req.Header, body)
	}
	sent := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		http.Error(w, "the engine did not answer", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		if !hopByHop[k] {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	var chunks []chunk
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			chunks = append(chunks, chunk{time.Now(), data})
			if _, werr := w.Write(data); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			break
		}
	}
	if shadowed {
		go p.send(trace(pair, "incumbent", sent, resp.StatusCode, body, chunks))
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve clients on")
	incumbent := flag.String("incumbent", "", "the incumbent's base URL")
	candidate := flag.String("candidate", "", "the candidate's base URL")
	brokers := flag.String("kafka", "", "Kafka bootstrap (none: records are dropped)")
	topic := flag.String("topic", "bench-native.exchanges", "the records' topic")
	off := flag.Bool("off", false, "shadowing off: forward only (no candidate, no parsing, no records)")
	flag.Parse()
	transport := &http.Transport{
		MaxIdleConnsPerHost: 1024, IdleConnTimeout: 60 * time.Second,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, DisableCompression: true,
	}
	p := &plane{incumbent: *incumbent, candidate: *candidate, client: &http.Client{Transport: transport}, topic: *topic, shadowing: !*off}
	if *brokers != "" {
		sink, err := kgo.NewClient(kgo.SeedBrokers(*brokers), kgo.ProducerLinger(100*time.Millisecond))
		if err != nil {
			log.Fatalf("kafka: %v", err)
		}
		defer sink.Close()
		p.sink = sink
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	log.Printf("serving on %s", ln.Addr())
	log.Fatal(http.Serve(ln, p))
}
