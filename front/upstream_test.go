package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestIncumbentURLHostAndCredentials(t *testing.T) {
	for url, host := range map[string]string{
		"http://h:80/": "h", "http://h:8000/base/": "h:8000", "https://h:443": "h", "http://[::1]:80": "[::1]",
		"http://u:p@h:81/b": "h:81",
	} {
		c := testConfig(url, "http://127.0.0.1:1", "x")
		if inc := newIncumbent(c); inc.host != host {
			t.Fatalf("%s: host %q, want %q", url, inc.host, host)
		}
	}
	inc := newIncumbent(testConfig("http://user:pw@h:8000/base/", "http://127.0.0.1:1", "x"))
	if got := inc.url("/v1/completions", "a=1&b=%2F").String(); got != "http://h:8000/base/v1/completions?a=1&b=%2F" {
		t.Fatal(got)
	}
	req := inc.request(context.Background(), inc.url("/v1/completions", ""), []header{{"content-type", "application/json"}}, []byte("{}"))
	if req.Header.Get("authorization") != "" || req.Header["authorization"][0] != "Basic dXNlcjpwdw==" || req.Host != "h:8000" ||
		req.ContentLength != 2 || req.Header["User-Agent"][0] != "" {
		t.Fatalf("%v", req.Header)
	}
	req = inc.request(context.Background(), inc.url("/v1/completions", ""), []header{{"authorization", "Bearer c"}, {"user-agent", "sdk"}}, nil)
	if len(req.Header["authorization"]) != 1 || req.Header["authorization"][0] != "Bearer c" || req.Header["User-Agent"][0] != "sdk" {
		t.Fatalf("%v", req.Header)
	}
	if got := redactURLs("dial http://user:secret@h:1/x: refused"); got != "dial http://user:***@h:1/x: refused" {
		t.Fatal(got)
	}
}

// An incumbent that closes a kept-alive connection when the next request comes on it, without
// an answer: the front asks once more on a new connection.
func TestAClosedKeptAliveConnectionIsRetriedOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(r)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if n == 1 {
						return // the second request on this connection: closed, unanswered
					}
					_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"))
				}
			}()
		}
	}()
	h := start(t, "http://"+ln.Addr().String(), nil, true)
	for i := 0; i < 3; i++ {
		resp, err := client().Post(h.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(got) != "{}" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, got)
		}
		h.tee.next(t)
		if end := h.tee.next(t); end["status"] != "ok" {
			t.Fatalf("end frame %v", end)
		}
	}
}
