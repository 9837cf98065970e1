package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The end-to-end harness: a front on a loopback port, an httptest incumbent, an httptest
// internal plane, and a fake tee listener that decodes the frames.

func TestMain(m *testing.M) {
	if os.Getenv("SHADOW_AB_FRONT_TEST_MAIN") == "1" { // the binary itself (TestBinary...)
		main()
		return
	}
	os.Exit(m.Run())
}

type teeListener struct {
	path   string
	ln     net.Listener
	frames chan map[string]any
	mu     sync.Mutex
	conns  []net.Conn
}

// down closes the listener and the connections it accepted: the tee is gone.
func (tl *teeListener) down() {
	tl.ln.Close()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, c := range tl.conns {
		c.Close()
	}
	tl.conns = nil
}

// newTeeListener listens on a Unix socket in a temporary directory and decodes every frame.
func newTeeListener(t *testing.T, dir string) *teeListener {
	tl := &teeListener{path: filepath.Join(dir, "tee.sock"), frames: make(chan map[string]any, 1000)}
	tl.listen(t)
	return tl
}

func (tl *teeListener) listen(t *testing.T) {
	ln, err := net.Listen("unix", tl.path)
	if err != nil {
		t.Fatal(err)
	}
	tl.ln = ln
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tl.mu.Lock()
			tl.conns = append(tl.conns, c)
			tl.mu.Unlock()
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				var head [4]byte
				for {
					if _, err := io.ReadFull(r, head[:]); err != nil {
						return
					}
					data := make([]byte, binary.BigEndian.Uint32(head[:]))
					if _, err := io.ReadFull(r, data); err != nil {
						return
					}
					var f map[string]any
					if err := json.Unmarshal(data, &f); err != nil {
						panic(err)
					}
					tl.frames <- f
				}
			}()
		}
	}()
}

func (tl *teeListener) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case f := <-tl.frames:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no tee frame")
		return nil
	}
}

type harness struct {
	url   string // the front's
	cfg   *config
	tee   *teeListener
	stop  chan struct{}
	done  chan int
	inner *httptest.Server
	front *front
	seen  chan *http.Request // what the internal plane got
}

func testConfig(incumbent, internal, teePath string) *config {
	rt := 5.0
	return &config{
		ListenFD: 3, Incumbent: incumbent, Internal: internal, Tee: teePath,
		Routes:       map[string]string{"/v1/chat/completions": "chat", "/v1/completions": "completions"},
		IncludeUsage: true, HideResponseHeaders: []string{"server", "set-cookie"},
		MaxBodyBytes: 1 << 20, MaxHeaderBytes: 8192, HeaderTimeoutS: 5, BodyTimeoutS: 5,
		IdleTimeoutS: 5, SendTimeoutS: 5, MaxConnections: 64, ReadTimeoutS: &rt,
		ConnectTimeoutS: 2, IncumbentMaxConnections: 16, TeeQueue: 64,
	}
}

// start runs a front for the incumbent URL; edit changes the configuration first. waitTee:
// wait until the front's tee is connected (frames are dropped before).
func start(t *testing.T, incumbent string, edit func(*config), waitTee bool) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{tee: newTeeListener(t, dir), stop: make(chan struct{}), done: make(chan int, 1),
		seen: make(chan *http.Request, 100)}
	h.inner = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		h.seen <- r
		w.Header().Set("x-internal", "yes")
		w.WriteHeader(218)
		_, _ = w.Write([]byte("internal:" + r.Method + " " + r.URL.RequestURI() + " " + string(body)))
	}))
	t.Cleanup(h.inner.Close)
	h.cfg = testConfig(incumbent, h.inner.URL, h.tee.path)
	if edit != nil {
		edit(h.cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.url = "http://" + ln.Addr().String()
	f, err := newFront(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.front = f
	go func() { h.done <- f.serve(ln, h.stop) }()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(h.stop) }); <-h.done })
	if waitTee {
		h.waitTee(t)
	}
	return h
}

// waitTee waits until the front's tee is connected.
func (h *harness) waitTee(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !h.front.tee.up.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the front's tee never connected")
		}
	}
}

// client is an http.Client that neither compresses nor keeps connections between tests.
func client() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: 20 * time.Second}
}

// dial: a raw connection to the front, closed at the test's end, with a 10 s deadline.
func dial(t *testing.T, h *harness) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	b, _ := io.ReadAll(c)
	return string(b)
}

// writeCompletion writes a POST /v1/completions with body on c, by hand.
func writeCompletion(c net.Conn, body string) {
	_, _ = c.Write([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body))
}

// keepAliveHealth: one GET /health on the kept-alive connection c (read through r), answered
// 218 by the internal plane, which has then seen it.
func keepAliveHealth(t *testing.T, h *harness, c net.Conn, r *bufio.Reader) {
	t.Helper()
	_, _ = c.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != 218 {
		t.Fatal(resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	<-h.seen
}
