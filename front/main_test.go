package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The binary as the mirror starts it: the listening socket inherited as fd 3, -config JSON.
func frontCommand(t *testing.T, cfg any, ln *net.TCPListener) *exec.Cmd {
	t.Helper()
	text, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-config", string(text))
	cmd.Env = append(os.Environ(), "SHADOW_AB_FRONT_TEST_MAIN=1")
	if ln != nil {
		f, err := ln.File()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		cmd.ExtraFiles = []*os.File{f} // fd 3
	}
	return cmd
}

func TestBinaryServesOnFd3AndDrainsOnSIGTERM(t *testing.T) {
	next := make(chan struct{})
	inc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			if i > 0 {
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
			}
			_, _ = w.Write([]byte("data: {\"choices\":[{\"index\":0,\"text\":\"" + strconv.Itoa(i) + "\"}]}\n\n"))
			w.(http.Flusher).Flush()
		}
	}))
	defer inc.Close()
	tl := newTeeListener(t, t.TempDir())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	cmd := frontCommand(t, testConfig(inc.URL, "http://127.0.0.1:1", tl.path), ln.(*net.TCPListener))
	var stderr syncBuffer
	cmd.Stderr = &stderr
	profile := t.TempDir() + "/front.prof" // and the CPU profile of the run, when asked for
	cmd.Env = append(cmd.Env, "SHADOW_AB_FRONT_CPUPROFILE="+profile)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ln.Close() // the front's copy is the only one that listens now
	cmd.ExtraFiles[0].Close()
	defer cmd.Process.Kill()
	// wait for the tee: frames before it are dropped
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "tee: connected"); {
		if time.Now().After(deadline) {
			t.Fatalf("no tee connection: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	writeCompletion(conn, `{"prompt":"x","stream":true}`)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 10)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	// SIGTERM mid-answer: the answer in flight finishes, then the front exits 0
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "draining"); {
		if time.Now().After(deadline) {
			t.Fatalf("no drain: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("still accepting after SIGTERM")
	}
	close(next)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.HasSuffix(rest, []byte("\"2\"}]}\n\n")) {
		t.Fatalf("the answer in flight was cut: %q %v", rest, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, stderr.String())
	}
	if prof, err := os.ReadFile(profile); err != nil || !bytes.HasPrefix(prof, []byte{0x1f, 0x8b}) {
		t.Fatalf("no pprof profile (gzip) at %s: %v %q", profile, err, prof[:min(len(prof), 8)])
	}
	req, end := tl.next(t), tl.next(t)
	var stream []byte
	for _, c := range end["chunks"].([]any) {
		stream = append(stream, b64(t, c.([]any)[1])...)
	}
	if req["k"] != "req" || end["k"] != "end" || end["status"] != "ok" || !bytes.Equal(stream, append(first, rest...)) {
		t.Fatalf("frames %v %v", req, end)
	}
}

func TestBadConfigExits2NamingTheKey(t *testing.T) {
	good := testConfig("http://127.0.0.1:1", "http://127.0.0.1:2", "/nonexistent/tee.sock")
	text, _ := json.Marshal(good)
	cases := map[string]func(m map[string]any){
		"max_body_bytes":            func(m map[string]any) { delete(m, "max_body_bytes") },
		"tee_quue":                  func(m map[string]any) { m["tee_quue"] = 1 },
		"idle_timeout_s":            func(m map[string]any) { m["idle_timeout_s"] = "75" },
		"read_timeout_s":            func(m map[string]any) { m["read_timeout_s"] = -1 },
		"incumbent":                 func(m map[string]any) { m["incumbent"] = "127.0.0.1:8000" },
		"routes":                    func(m map[string]any) { m["routes"] = map[string]string{"/v1//x": "chat"} },
		"listen_fd 3":               func(m map[string]any) {},
		"max_connections":           func(m map[string]any) { m["max_connections"] = 0 },
		"incumbent_max_connections": func(m map[string]any) { m["incumbent_max_connections"] = -1 },
	}
	for key, edit := range cases {
		var m map[string]any
		_ = json.Unmarshal(text, &m)
		edit(m)
		cmd := frontCommand(t, m, nil) // no fd 3
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), key) {
			t.Fatalf("%s: %v %q", key, err, stderr.String())
		}
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A mirror worker killed with SIGKILL leaves no front behind serving the shared socket.
func TestTheFrontStopsWhenItsParentDies(t *testing.T) {
	tl := newTeeListener(t, t.TempDir())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	text, _ := json.Marshal(testConfig("http://127.0.0.1:1", "http://127.0.0.1:1", tl.path))
	// the parent: a shell that starts the front (fd 3 inherited), says its pid, and waits
	parent := exec.Command("sh", "-c", `"$0" -config "$1" & echo $!; wait`, os.Args[0], string(text))
	parent.Env = append(os.Environ(), "SHADOW_AB_FRONT_TEST_MAIN=1")
	f, _ := ln.(*net.TCPListener).File()
	parent.ExtraFiles = []*os.File{f}
	out, _ := parent.StdoutPipe()
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ln.Close()
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	// running: its tee connected (the socket itself listens from the start)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tl.mu.Lock()
		up := len(tl.conns) > 0
		tl.mu.Unlock()
		if up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the front never started")
		}
	}
	_ = parent.Process.Kill()
	_ = parent.Wait()
	alive := func() bool { // a zombie (nobody reaps it here) has stopped too
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err == nil && !strings.Contains(string(stat), ") Z ")
	}
	for deadline := time.Now().Add(10 * time.Second); alive(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			t.Fatalf("the front outlived its parent: %s", stat)
		}
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("still accepting after its parent died")
	}
}
