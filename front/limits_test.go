package main

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The limits of mirror/limits.py, with the mirror's answers byte for byte.

func TestHeadLimits(t *testing.T) {
	h := start(t, "http://127.0.0.1:1", func(c *config) {
		c.MaxHeaderBytes = 8192
		c.HeaderTimeoutS = 0.3
	}, false)
	// a head over max_header_bytes: 431, the mirror's answer, closed
	c := dial(t, h)
	_, _ = c.Write([]byte("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n"))
	if got := readAll(t, c); got != string(h.front.answers.headerTooLarge) {
		t.Fatalf("431: %q", got)
	}
	// a head just under it passes (to the internal plane)
	c = dial(t, h)
	head := "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
	_, _ = c.Write([]byte(head + strings.Repeat("a", 8192-len(head)-4) + "\r\n\r\n"))
	if got := readAll(t, c); !strings.HasPrefix(got, "HTTP/1.1 218") {
		t.Fatalf("8192 bytes of head: %q", got)
	}
	<-h.seen
	// the same on a kept-alive connection (net/http's own limit is looser there)
	c = dial(t, h)
	r := bufio.NewReader(c)
	keepAliveHealth(t, h, c, r)
	_, _ = c.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8200) + "\r\n\r\n"))
	if got, _ := io.ReadAll(r); string(got) != string(h.front.answers.headerTooLarge) {
		t.Fatalf("431 on a kept-alive connection: %q", got)
	}
	// part of a head, then nothing: 408 with the mirror's wording
	c = dial(t, h)
	_, _ = c.Write([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"))
	got := readAll(t, c)
	if got != string(h.front.answers.headerTimeout) || !strings.Contains(got, "within 0.3s (limits.header_timeout_s)") {
		t.Fatalf("408: %q", got)
	}
	// nothing at all: closed without an answer (as nginx)
	c = dial(t, h)
	if got := readAll(t, c); got != "" {
		t.Fatalf("silent connection: %q", got)
	}
	// a head that does not parse: wire.py's 400
	c = dial(t, h)
	_, _ = c.Write([]byte("NOT HTTP\r\n\r\n"))
	if got := readAll(t, c); got != string(badRequest) {
		t.Fatalf("400: %q", got)
	}
}

func TestBodyTimeoutIs408(t *testing.T) {
	h := start(t, "http://127.0.0.1:1", func(c *config) { c.BodyTimeoutS = 0.2 }, false)
	c := dial(t, h)
	_, _ = c.Write([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a\""))
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := problemOf(t, resp)
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("not closed after the 408: %q %v", rest, err)
	}
	if resp.StatusCode != 408 || !resp.Close ||
		p["detail"] != "the request's body did not arrive within 0.2s of its headers (limits.body_timeout_s): send the whole body at once" ||
		p["error"].(map[string]any)["type"] != "timeout_error" {
		t.Fatalf("%d %v", resp.StatusCode, p)
	}
}

func TestConnectionCapAndIdleTimeout(t *testing.T) {
	h := start(t, "http://127.0.0.1:1", func(c *config) {
		c.MaxConnections = 2
		c.IdleTimeoutS = 0.3
	}, false)
	a, b := dial(t, h), dial(t, h)
	// a keep-alive exchange on a, so both are surely accepted before the third
	ra := bufio.NewReader(a)
	keepAliveHealth(t, h, a, ra)
	keepAliveHealth(t, h, b, bufio.NewReader(b))
	c := dial(t, h)
	got := readAll(t, c)
	if got != string(h.front.answers.cap) || !strings.Contains(got, "retry-after: 1\r\n") ||
		!strings.HasPrefix(got, "HTTP/1.1 503 Service Unavailable\r\n") {
		t.Fatalf("503: %q", got)
	}
	// idle for idle_timeout_s: closed (without an answer)
	if _, err := ra.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection not closed: %v", err)
	}
}

func TestASlowClientIsDisconnectedAfterSendTimeout(t *testing.T) {
	big := strings.Repeat("data: {\"choices\":[{\"index\":0,\"text\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}]}\n\n", 2000)
	stopped := make(chan struct{})
	inc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		defer close(stopped)
		for i := 0; i < 200; i++ { // ~30 MB, far more than the socket buffers hold
			if _, err := w.Write([]byte(big)); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	defer inc.Close()
	h := start(t, inc.URL, func(c *config) { c.SendTimeoutS = 0.3 }, true)
	c := dial(t, h)
	body := `{"prompt":"x","stream":true}`
	writeCompletion(c, body)
	// never read: the front gives up on this client and cancels the incumbent's request
	h.tee.next(t)
	end := h.tee.next(t)
	if end["status"] != "cancelled" || end["gone"] != true || end["send_timeout"] != true ||
		end["error"] != "the client took none of its answer for 0.3s (limits.send_timeout_s)" {
		t.Fatalf("end frame %v", end)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the incumbent's request was not cancelled")
	}
}

// Each refusal reaches the mirror as an edge frame with mirror/limits.py's reason, so the
// mirror's shadow_ab_mirror_edge_rejections_total counts them as on the protocol plane.
func TestRefusalsAreToldToTheMirror(t *testing.T) {
	h := start(t, "http://127.0.0.1:1", func(c *config) {
		c.HeaderTimeoutS = 0.2
		c.BodyTimeoutS = 0.2
		c.MaxConnections = 3
	}, true)
	reasons := func(n int) []string {
		t.Helper()
		var got []string
		for len(got) < n {
			f := h.tee.next(t)
			if f["k"] == "edge" {
				got = append(got, f["reason"].(string))
			}
		}
		return got
	}
	c := dial(t, h)
	_, _ = c.Write([]byte("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n"))
	readAll(t, c)
	c = dial(t, h)
	_, _ = c.Write([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"))
	readAll(t, c)
	readAll(t, dial(t, h)) // silent: closed without an answer
	c = dial(t, h)
	_, _ = c.Write([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a\""))
	readAll(t, c)
	want := []string{edgeHeaderTooLarge, edgeHeaderTimeout, edgeIdleClosed, edgeBodyTimeout}
	if got := reasons(4); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("edge frames %v, want %v", got, want)
	}
	// over the cap: three held open, the fourth refused with 503
	for range 3 {
		dial(t, h) // open until the test ends
	}
	time.Sleep(50 * time.Millisecond)
	if got := readAll(t, dial(t, h)); !strings.HasPrefix(got, "HTTP/1.1 503") {
		t.Fatalf("over the cap: %q", got)
	}
	// the three held ones time out silently too (header_timeout_idle) before or after it
	got := reasons(4)
	if strings.Count(strings.Join(got, ","), edgeConnectionCap) != 1 {
		t.Fatalf("edge frames %v, want one %s", got, edgeConnectionCap)
	}
}
