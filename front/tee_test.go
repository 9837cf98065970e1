package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Frames sent while and after the tee closes are dropped, never a panic; what was queued
// before is written, each frame a 4-byte big-endian length and a JSON object.
func TestTeeFramesAndClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tee.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []map[string]any, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		r := bufio.NewReader(c)
		var frames []map[string]any
		var head [4]byte
		for {
			if _, err := io.ReadFull(r, head[:]); err != nil {
				got <- frames
				return
			}
			data := make([]byte, binary.BigEndian.Uint32(head[:]))
			if _, err := io.ReadFull(r, data); err != nil {
				got <- frames
				return
			}
			var f map[string]any
			_ = json.Unmarshal(data, &f)
			frames = append(frames, f)
		}
	}()
	tee := newTee(path, 16)
	for deadline := time.Now().Add(5 * time.Second); !tee.up.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no tee connection")
		}
	}
	lt := 0.5
	tee.send(&reqFrame{K: "req", ID: 1, Body: []byte("hi"), Headers: []header{{"a", "b"}}})
	tee.send(&endFrame{K: "end", ID: 1, Status: "ok", Chunks: []chunk{{0.25, []byte("x")}}, Parts: [][]byte{}, LastT: &lt})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				tee.send(&endFrame{K: "end", ID: 99, Status: "ok"})
			}
		}()
	}
	tee.close(5 * time.Second)
	wg.Wait()
	frames := <-got
	if len(frames) < 2 || frames[0]["k"] != "req" || frames[0]["body"] != "aGk=" || frames[1]["k"] != "end" {
		t.Fatalf("frames %v", frames[:min(len(frames), 2)])
	}
	c := frames[1]["chunks"].([]any)[0].([]any)
	if c[0] != 0.25 || c[1] != "eA==" || frames[1]["last_t"] != 0.5 || frames[1]["error"] != nil {
		t.Fatalf("end frame %v", frames[1])
	}
	if int64(len(frames)-2)+tee.total.Load() != 1600 {
		t.Fatalf("%d frames written, %d dropped: want 1600 in all", len(frames)-2, tee.total.Load())
	}
}
