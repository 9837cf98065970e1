package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sseIncumbent answers like vLLM 0.32: the testdata stream with the usage event when the
// request asks for include_usage, the plain one otherwise; one flush per event. It records
// each request (headers, body) on got.
type sseIncumbent struct {
	*httptest.Server
	got chan seenRequest
}

type seenRequest struct {
	header http.Header
	host   string
	uri    string
	body   []byte
}

func newSSEIncumbent(t *testing.T) *sseIncumbent {
	inc := &sseIncumbent{got: make(chan seenRequest, 100)}
	usage, _ := os.ReadFile("testdata/vllm032_chat_n2_usage.sse")
	plain, _ := os.ReadFile("testdata/vllm032_chat_n2_plain.sse")
	inc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		inc.got <- seenRequest{r.Header.Clone(), r.Host, r.RequestURI, body}
		stream := plain
		if bytes.Contains(body, []byte(`"include_usage":true`)) {
			stream = usage
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Server", "engine")
		w.Header().Set("X-Engine", "vllm")
		w.WriteHeader(200)
		for _, ev := range bytes.SplitAfter(stream, []byte("\n\n")) {
			if len(ev) == 0 {
				continue
			}
			_, _ = w.Write(ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(inc.Close)
	return inc
}

func b64(t *testing.T, v any) []byte {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("not base64 text: %v", v)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGenerateStreamEndToEnd(t *testing.T) {
	inc := newSSEIncumbent(t)
	h := start(t, inc.URL+"/", nil, true)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}], "stream": true}`
	req, _ := http.NewRequest("POST", h.url+"//v1/chat/./completions?x=1", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("X-Shadow-Pair-Id", "forged")
	req.Header.Set("Connection", "keep-alive, x-hop")
	req.Header.Set("X-Hop", "1")
	resp, err := client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	plain, _ := os.ReadFile("testdata/vllm032_chat_n2_plain.sse")
	if resp.StatusCode != 200 || !bytes.Equal(got, plain) {
		t.Fatalf("client got %d %q", resp.StatusCode, got)
	}
	pair := resp.Header.Get("x-shadow-pair-id")
	if len(pair) != 36 || resp.Header.Get("Server") != "" || resp.Header.Get("X-Engine") != "vllm" ||
		resp.Header.Get("Content-Type") != "text/event-stream" || resp.ContentLength != -1 {
		t.Fatalf("client headers %v", resp.Header)
	}
	seen := <-inc.got
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}], "stream": true,"stream_options":{"include_usage":true}}`
	if string(seen.body) != want || seen.uri != "/v1/chat/completions?x=1" ||
		seen.header.Get("X-Shadow-Pair-Id") != pair || seen.header.Get("Authorization") != "Bearer k" ||
		seen.header.Get("X-Hop") != "" || seen.header.Get("User-Agent") != "Go-http-client/1.1" ||
		seen.host != strings.TrimPrefix(inc.URL, "http://") || seen.header.Get("Accept-Encoding") != "" {
		t.Fatalf("incumbent got %s %q %v", seen.uri, seen.body, seen.header)
	}
	req1 := h.tee.next(t)
	if req1["k"] != "req" || req1["pair"] != pair || req1["route"] != "/v1/chat/completions" ||
		req1["path"] != "//v1/chat/./completions?x=1" || string(b64(t, req1["body"])) != body ||
		req1["too_large"] != false || req1["wall"].(float64) < 1.7e9 {
		t.Fatalf("req frame %v", req1)
	}
	hdrs := map[string]string{}
	for _, kv := range req1["headers"].([]any) {
		p := kv.([]any)
		hdrs[p[0].(string)] = p[1].(string)
	}
	if hdrs["authorization"] != "Bearer k" || hdrs["content-type"] != "application/json" || hdrs["host"] == "" {
		t.Fatalf("req frame headers %v", hdrs)
	}
	end := h.tee.next(t)
	if end["k"] != "end" || end["id"] != req1["id"] || end["status"] != "ok" || end["http_status"] != 200.0 ||
		end["client_code"] != 200.0 || end["error"] != nil || end["sse"] != true || end["gone"] != false ||
		end["held_s"] == nil || end["added_s"] == nil || end["last_t"] == nil {
		t.Fatalf("end frame %v", end)
	}
	var stream []byte
	last := -1.0
	for _, c := range end["chunks"].([]any) {
		p := c.([]any)
		if p[0].(float64) < last {
			t.Fatal("chunk times go back")
		}
		last = p[0].(float64)
		stream = append(stream, b64(t, p[1])...)
	}
	usage, _ := os.ReadFile("testdata/vllm032_chat_n2_usage.sse")
	if !bytes.Equal(stream, usage) || len(end["parts"].([]any)) != 0 {
		t.Fatalf("end frame chunks %q", stream)
	}
}

func TestNotStreamedAnswersPassUnchanged(t *testing.T) {
	inc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "a=b")
		if bytes.Contains(body, []byte("bad")) {
			w.WriteHeader(400)
		}
		_, _ = w.Write([]byte(`{"echo":` + string(body) + `}`))
	}))
	defer inc.Close()
	h := start(t, inc.URL, nil, true)
	for _, c := range []struct {
		body   string
		code   int
		status string
	}{{`{"prompt":"x","stream":false}`, 200, "ok"}, {`{"bad":1}`, 400, "http_error"}, {`not json`, 200, "ok"}} {
		resp, err := client().Post(h.url+"/v1/completions", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || string(got) != `{"echo":`+c.body+`}` || resp.Header.Get("Set-Cookie") != "" ||
			resp.ContentLength != int64(len(got)) {
			t.Fatalf("%s: %d %q %v", c.body, resp.StatusCode, got, resp.Header)
		}
		h.tee.next(t)
		end := h.tee.next(t)
		parts := end["parts"].([]any)
		if end["status"] != c.status || end["sse"] != false || len(parts) == 0 || end["held_s"] != nil ||
			!strings.HasPrefix(string(b64(t, parts[0])), `{"echo":`) {
			t.Fatalf("end frame %v", end)
		}
	}
}

func TestOtherRequestsReachTheInternalPlaneUnchanged(t *testing.T) {
	h := start(t, "http://127.0.0.1:1", nil, false)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/models?x=1&y=%2F", ""},
		{"POST", "/v1/embeddings", `{"input":"x"}`},
		{"GET", "/v1/chat/completions", ""},
		{"DELETE", "/admin/..%2Fx", ""},
	} {
		req, _ := http.NewRequest(c.method, h.url+c.path, strings.NewReader(c.body))
		req.Header.Set("X-Client", "c1")
		req.Header.Set("X-Forwarded-For", "10.0.0.1")
		resp, err := client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen := <-h.seen
		if resp.StatusCode != 218 || resp.Header.Get("X-Internal") != "yes" ||
			string(got) != "internal:"+c.method+" "+c.path+" "+c.body || seen.Header.Get("X-Client") != "c1" ||
			seen.Header.Get("X-Forwarded-For") != "10.0.0.1" || seen.Header.Get("X-Forwarded-Host") != "" ||
			seen.Host != strings.TrimPrefix(h.url, "http://") {
			t.Fatalf("%s %s: %d %q %v", c.method, c.path, resp.StatusCode, got, seen.Header)
		}
	}
}

func problemOf(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	var p map[string]any
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != problemJSON || json.Unmarshal(body, &p) != nil {
		t.Fatalf("not a problem answer: %v %q", resp.Header, body)
	}
	return p
}

func TestUnreachableIncumbentIs502(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	h := start(t, "http://user:secret@"+addr, nil, true)
	resp, err := client().Post(h.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	pair := resp.Header.Get("x-shadow-pair-id")
	p := problemOf(t, resp)
	detail, _ := p["detail"].(string)
	if resp.StatusCode != 502 || len(pair) != 36 || !strings.HasPrefix(detail, "the incumbent is unreachable: ") ||
		strings.Contains(detail, "secret") || p["error"].(map[string]any)["type"] != "BadGateway" {
		t.Fatalf("%d %v", resp.StatusCode, p)
	}
	h.tee.next(t)
	end := h.tee.next(t)
	if end["status"] != "connection_error" || end["http_status"] != nil || end["client_code"] != 502.0 ||
		end["error"] == nil || end["last_t"] != nil {
		t.Fatalf("end frame %v", end)
	}
}

func TestSlowIncumbentIs504BeforeTheHeadAndCutAfter(t *testing.T) {
	release := make(chan struct{})
	inc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.RawQuery, "after") {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("data: {\"choices\":[]}\n\n"))
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer inc.Close()
	defer close(release)
	h := start(t, inc.URL, func(c *config) { rt := 0.2; c.ReadTimeoutS = &rt }, true)
	resp, err := client().Post(h.url+"/v1/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	p := problemOf(t, resp)
	if resp.StatusCode != 504 || p["detail"] != "the incumbent did not answer" || resp.Header.Get("x-shadow-pair-id") == "" {
		t.Fatalf("%d %v", resp.StatusCode, p)
	}
	h.tee.next(t)
	if end := h.tee.next(t); end["status"] != "timeout" || end["client_code"] != 504.0 ||
		end["error"] != "timeout: no byte from the incumbent in 0.2s" {
		t.Fatalf("end frame %v", end)
	}
	// after the head: the client's answer is cut (no chunked terminator)
	resp, err = client().Post(h.url+"/v1/completions?after=1", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err == nil || string(got) != "data: {\"choices\":[]}\n\n" {
		t.Fatalf("%d %q %v", resp.StatusCode, got, err)
	}
	h.tee.next(t)
	if end := h.tee.next(t); end["status"] != "timeout" || end["client_code"] != 200.0 || end["gone"] != false ||
		len(end["chunks"].([]any)) != 1 {
		t.Fatalf("end frame %v", end)
	}
}

func TestTooLargeBodyIs413WithFrames(t *testing.T) {
	inc := newSSEIncumbent(t)
	h := start(t, inc.URL, func(c *config) { c.MaxBodyBytes = 100 }, true)
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(strings.Repeat("x", 101))
		if chunked {
			body = io.MultiReader(strings.NewReader(strings.Repeat("x", 60)), strings.NewReader(strings.Repeat("y", 60)))
		}
		resp, err := client().Post(h.url+"/v1/chat/completions", "application/json", body)
		if err != nil {
			t.Fatal(err)
		}
		p := problemOf(t, resp)
		if resp.StatusCode != 413 || p["detail"] != "request body is larger than the mirror's limit of 100 bytes (max_body_bytes)" ||
			p["error"].(map[string]any)["type"] != "RequestTooLarge" || p["title"] != "Request Entity Too Large" {
			t.Fatalf("%d %v", resp.StatusCode, p)
		}
		req := h.tee.next(t)
		end := h.tee.next(t)
		if req["too_large"] != true || req["body"] != "" || req["route"] != "/v1/chat/completions" ||
			end["status"] != "http_error" || end["http_status"] != 413.0 || end["client_code"] != 413.0 {
			t.Fatalf("frames %v %v", req, end)
		}
	}
	select {
	case r := <-inc.got:
		t.Fatalf("the incumbent was asked: %v", r)
	default:
	}
	// any other path too, without frames
	resp, err := client().Post(h.url+"/v1/embeddings", "application/json", strings.NewReader(strings.Repeat("x", 101)))
	if err != nil {
		t.Fatal(err)
	}
	if problemOf(t, resp); resp.StatusCode != 413 {
		t.Fatal(resp.StatusCode)
	}
}

func TestClientDisconnectCancelsTheIncumbentRequest(t *testing.T) {
	cancelled := make(chan struct{})
	inc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	}))
	defer inc.Close()
	h := start(t, inc.URL, nil, true)
	conn := dial(t, h)
	writeCompletion(conn, `{"prompt":"x","stream":true}`)
	r := bufio.NewReader(conn)
	line, _ := r.ReadString('\n')
	if !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatal(line)
	}
	for { // the first event reached the client
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(l, "data:") {
			break
		}
	}
	conn.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the incumbent's request was not cancelled")
	}
	h.tee.next(t)
	if end := h.tee.next(t); end["status"] != "cancelled" || end["gone"] != true || end["client_code"] != 200.0 {
		t.Fatalf("end frame %v", end)
	}
}

func TestATeeThatIsDownNeverBlocksTheClient(t *testing.T) {
	inc := newSSEIncumbent(t)
	h := start(t, inc.URL, nil, true)
	h.tee.down() // nobody listens: the front retries in the background
	body := `{"messages":[],"stream":true}`
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", h.url+"/v1/chat/completions", strings.NewReader(body))
		resp, err := client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != 200 || !bytes.Contains(got, []byte("[DONE]")) {
			t.Fatalf("%d %q", resp.StatusCode, got)
		}
	}
	// the tee comes back: the next frame delivered carries the count of those dropped
	os.Remove(h.tee.path)
	h.tee.listen(t)
	deadline := time.Now().Add(10 * time.Second)
	total := 0.0
	for time.Now().Before(deadline) && total < 6 {
		resp, err := client().Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		select {
		case f := <-h.tee.frames:
			total += f["dropped"].(float64)
			if f["k"] == "end" {
				deadline = time.Time{}
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	if total < 6 {
		t.Fatalf("dropped frames counted: %v, want at least 6", total)
	}
}

// An HTTP/1.0 client gets the stream without chunked framing, ended by the close; its req
// frame has no host when it sent none.
func TestHTTP10ClientStream(t *testing.T) {
	inc := newSSEIncumbent(t)
	h := start(t, inc.URL, nil, true)
	c := dial(t, h)
	body := `{"messages":[],"stream":true}`
	_, _ = c.Write([]byte("POST /v1/chat/completions HTTP/1.0\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	got, _ := io.ReadAll(c)
	head, rest, _ := bytes.Cut(got, []byte("\r\n\r\n"))
	plain, _ := os.ReadFile("testdata/vllm032_chat_n2_plain.sse")
	if !bytes.HasPrefix(head, []byte("HTTP/1.0 200 OK\r\n")) || bytes.Contains(bytes.ToLower(head), []byte("chunked")) ||
		!bytes.Equal(rest, plain) {
		t.Fatalf("%q", got)
	}
	if req := h.tee.next(t); len(req["headers"].([]any)) != 1 { // content-length only
		t.Fatalf("req frame %v", req)
	}
	if end := h.tee.next(t); end["status"] != "ok" {
		t.Fatalf("end frame %v", end)
	}
}

// A client that leaves before the incumbent's head: the incumbent's request is cancelled and
// the end frame says so, with no status from the incumbent and nothing sent to the client.
func TestClientGoneBeforeTheHead(t *testing.T) {
	asked, cancelled := make(chan struct{}), make(chan struct{})
	inc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // (net/http notices a closed connection once the body is read)
		close(asked)
		<-r.Context().Done()
		close(cancelled)
	}))
	defer inc.Close()
	h := start(t, inc.URL, nil, true)
	c := dial(t, h)
	writeCompletion(c, `{"prompt":"x"}`)
	<-asked
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the incumbent's request was not cancelled")
	}
	h.tee.next(t)
	if end := h.tee.next(t); end["status"] != "cancelled" || end["gone"] != true || end["client_code"] != 0.0 ||
		end["http_status"] != nil || end["error"] != "the client disconnected" {
		t.Fatalf("end frame %v", end)
	}
}
