package main

import (
	"bufio"
	"encoding/binary"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The tee: what happened on the client's path, told to the Python mirror over a Unix stream
// socket, never on the client's critical path. Frames go through a bounded queue drained by one
// writer goroutine; when the queue is full or the socket is down a frame is dropped and counted
// (a dropped req frame drops its end frame too), and the count rides on the next frame
// delivered as "dropped". Frame: 4-byte big-endian length, then a JSON object (front/README.md).

type frame interface {
	frameID() uint64
	isReq() bool
	setDropped(n int64)
	appendJSON(b []byte) []byte // tee_json.go
}

type reqFrame struct {
	K        string   `json:"k"`
	ID       uint64   `json:"id"`
	Pair     string   `json:"pair"`
	Route    string   `json:"route"`
	Path     string   `json:"path"`
	Headers  []header `json:"headers"`
	Body     []byte   `json:"body"`
	TooLarge bool     `json:"too_large"`
	Wall     float64  `json:"wall"`
	Dropped  int64    `json:"dropped"`
}

type endFrame struct {
	K           string   `json:"k"`
	ID          uint64   `json:"id"`
	Status      string   `json:"status"`
	HTTPStatus  *int     `json:"http_status"`
	ClientCode  int      `json:"client_code"`
	Error       *string  `json:"error"`
	SSE         bool     `json:"sse"`
	Chunks      []chunk  `json:"chunks"`
	Parts       [][]byte `json:"parts"`
	LastT       *float64 `json:"last_t"`
	AddedS      *float64 `json:"added_s"`
	HeldS       *float64 `json:"held_s"`
	Gone        bool     `json:"gone"`
	SendTimeout bool     `json:"send_timeout"`
	Dropped     int64    `json:"dropped"`
}

// edgeFrame: a client connection or request the limits refused (the mirror counts it in
// shadow_ab_mirror_edge_rejections_total); reason is one of mirror/limits.py's.
type edgeFrame struct {
	K       string `json:"k"`
	Reason  string `json:"reason"`
	Dropped int64  `json:"dropped"`
}

// The reasons of edge frames, as mirror/limits.py names them.
const (
	edgeConnectionCap  = "connection_cap"
	edgeHeaderTooLarge = "header_too_large"
	edgeHeaderTimeout  = "header_timeout"
	edgeIdleClosed     = "header_timeout_idle"
	edgeBodyTimeout    = "body_timeout"
)

func (f *edgeFrame) frameID() uint64    { return 0 }
func (f *edgeFrame) isReq() bool        { return false }
func (f *edgeFrame) setDropped(n int64) { f.Dropped = n }

func (f *reqFrame) frameID() uint64    { return f.ID }
func (f *reqFrame) isReq() bool        { return true }
func (f *reqFrame) setDropped(n int64) { f.Dropped = n }
func (f *endFrame) frameID() uint64    { return f.ID }
func (f *endFrame) isReq() bool        { return false }
func (f *endFrame) setDropped(n int64) { f.Dropped = n }

// chunk is one body chunk as read from the incumbent: [seconds since t0, "<base64>"].
type chunk struct {
	T    float64
	Data []byte
}

type tee struct {
	path     string
	mu       sync.RWMutex // send (read) against close (write): no send on a closed queue
	ch       chan frame
	up       atomic.Bool
	closing  atomic.Bool
	dropped  atomic.Int64 // since the last frame delivered
	total    atomic.Int64 // dropped since the start (logged at exit)
	finished chan struct{}
	lost     map[uint64]bool // req frames lost after they were queued (writer only)
}

func newTee(path string, size int) *tee {
	t := &tee{path: path, ch: make(chan frame, size), finished: make(chan struct{}), lost: map[uint64]bool{}}
	go t.run()
	return t
}

func (t *tee) drop(n int64) {
	t.dropped.Add(n)
	t.total.Add(n)
}

// send queues a frame without ever blocking; false when it was dropped.
func (t *tee) send(f frame) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if !t.up.Load() || t.closing.Load() {
		t.drop(1)
		return false
	}
	select {
	case t.ch <- f:
		return true
	default:
		t.drop(1)
		return false
	}
}

// close stops taking frames and waits (up to wait) for the queued ones to be written. A
// handler still running (after a second signal) may still send: its frame is dropped.
func (t *tee) close(wait time.Duration) {
	t.mu.Lock()
	t.closing.Store(true)
	close(t.ch)
	t.mu.Unlock()
	select {
	case <-t.finished:
	case <-time.After(wait):
		log.Printf("tee: %d frames still queued after %s: not delivered", len(t.ch), wait)
	}
}

func (t *tee) run() {
	defer close(t.finished)
	backoff := 100 * time.Millisecond
	for {
		conn, err := net.Dial("unix", t.path)
		if err != nil {
			if t.closing.Load() {
				t.drain()
				return
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		t.up.Store(true)
		log.Printf("tee: connected to %s", t.path)
		finished := t.write(conn)
		t.up.Store(false)
		conn.Close()
		if finished {
			return
		}
		log.Printf("tee: the connection to %s broke: frames are dropped until it is back", t.path)
	}
}

// drain counts what is left in a closed queue as dropped.
func (t *tee) drain() {
	for range t.ch {
		t.drop(1)
	}
}

// write sends queued frames until the queue is closed (true) or the socket breaks (false).
func (t *tee) write(conn net.Conn) bool {
	w := bufio.NewWriterSize(conn, 256<<10)
	var unflushed []uint64      // req frames in the buffer, lost if the flush fails
	var buffered, carried int64 // frames in the buffer, and the drop counts they carry
	fail := func() bool {
		for _, id := range unflushed {
			t.lost[id] = true
		}
		t.dropped.Add(carried) // not delivered: the next frame carries them again
		t.drop(buffered)
		return false
	}
	var data []byte // reused: a frame's JSON
	var head [4]byte
	for f := range t.ch {
		if !f.isReq() && t.lost[f.frameID()] {
			delete(t.lost, f.frameID())
			t.drop(1)
			continue
		}
		n := t.dropped.Swap(0)
		f.setDropped(n)
		data = f.appendJSON(data[:0])
		binary.BigEndian.PutUint32(head[:], uint32(len(data)))
		_, err := w.Write(head[:])
		if err == nil {
			_, err = w.Write(data)
		}
		buffered++
		carried += n
		if f.isReq() {
			unflushed = append(unflushed, f.frameID())
		}
		if err == nil && len(t.ch) == 0 {
			if err = w.Flush(); err == nil {
				unflushed, buffered, carried = unflushed[:0], 0, 0
			}
		}
		if err != nil {
			return fail()
		}
	}
	if err := w.Flush(); err != nil {
		fail()
	}
	return true
}
