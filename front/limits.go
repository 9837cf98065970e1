package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The limits of mirror/limits.py on the client's connections. net/http enforces the header
// size, the header, idle and body deadlines itself but answers them its own way (431 with a
// text body, a silent close on a header timeout), so the listener and its connections are
// wrapped: more than max_connections open get 503 and are closed, a header timeout after a
// partial head gets 408, and net/http's own 431 and 400 answers are replaced by the mirror's.

type limitAnswers struct {
	cap, headerTooLarge, headerTimeout []byte
	bodyTimeout                        string // detail of the 408 for a late body
}

func newLimitAnswers(c *config) limitAnswers {
	return limitAnswers{
		cap: rejectBytes(503, fmt.Sprintf("the mirror has %d client connections open"+
			" (limits.max_connections): retry shortly, or reuse connections", c.MaxConnections),
			[2]string{"retry-after", "1"}),
		headerTooLarge: rejectBytes(431, fmt.Sprintf("the request line and headers exceed %d bytes"+
			" (limits.max_header_bytes): send fewer or smaller headers", c.MaxHeaderBytes)),
		headerTimeout: rejectBytes(408, fmt.Sprintf("the request's headers did not arrive within %ss"+
			" (limits.header_timeout_s): send the whole head at once", pyG(c.HeaderTimeoutS))),
		bodyTimeout: fmt.Sprintf("the request's body did not arrive within %ss of its headers"+
			" (limits.body_timeout_s): send the whole body at once", pyG(c.BodyTimeoutS)),
	}
}

// pyG is Python's f"{x:g}".
func pyG(x float64) string { return fmt.Sprintf("%g", x) }

// net/http's own answers to a head it refuses (server.go), written straight on the connection.
var (
	goTooLarge   = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\n")
	goBadRequest = []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")
)

type limitListener struct {
	net.Listener
	max       int64
	open      atomic.Int64
	answers   *limitAnswers
	rejected  atomic.Int64 // over the connection cap
	refusedHd atomic.Int64 // 431, 408 on the head
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Load() >= l.max {
			l.rejected.Add(1)
			go linger(c, l.answers.cap)
			continue
		}
		l.open.Add(1)
		return &limitConn{Conn: c, l: l}, nil
	}
}

// linger writes a whole answer, closes the writing side and waits (briefly) for the client to
// close, so the answer is not lost to a reset.
func linger(c net.Conn, answer []byte) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(answer); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

// limitConn is one client connection: it knows whether a handler is running (active) and how
// many bytes of a head arrived since the last request.
type limitConn struct {
	net.Conn
	l         *limitListener
	mu        sync.Mutex
	active    bool
	headBytes int
	answered  bool
	closed    sync.Once
}

type connKey struct{}

func connOf(ctx context.Context) *limitConn {
	c, _ := ctx.Value(connKey{}).(*limitConn)
	return c
}

// begin: a request's head was read and its handler runs.
func (c *limitConn) begin() {
	c.mu.Lock()
	c.active, c.headBytes = true, 0
	c.mu.Unlock()
}

// end: the handler returned; what is read next is the next request's head.
func (c *limitConn) end() {
	c.mu.Lock()
	c.active, c.headBytes = false, 0
	c.mu.Unlock()
}

func (c *limitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.active {
		c.headBytes += n
		if err != nil && c.headBytes > 0 && !c.answered && errors.Is(err, os.ErrDeadlineExceeded) {
			// part of a head, then nothing for header_timeout_s (net/http would close silently;
			// a connection that sent nothing is closed silently, as nginx does)
			c.answered = true
			c.l.refusedHd.Add(1)
			_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Conn.Write(c.l.answers.headerTimeout)
		}
	}
	return n, err
}

func (c *limitConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	active := c.active
	c.mu.Unlock()
	if !active {
		var answer []byte
		switch {
		case bytes.HasPrefix(p, goTooLarge):
			answer = c.l.answers.headerTooLarge
			c.l.refusedHd.Add(1)
		case bytes.HasPrefix(p, goBadRequest):
			answer = badRequest
		}
		if answer != nil {
			if _, err := c.Conn.Write(answer); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return c.Conn.Write(p)
}

func (c *limitConn) Close() error {
	c.closed.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// goMaxHeaderBytes is http.Server.MaxHeaderBytes for a limit on the head's bytes: net/http
// reads up to MaxHeaderBytes + 4096 bytes of a head.
func goMaxHeaderBytes(limit int) int {
	return max(limit-4096, 1)
}
