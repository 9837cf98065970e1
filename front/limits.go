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
// timeout and the idle timeout itself but answers them its own way (a silent close), and its
// header size limit is loose (4 KiB more, and more on a kept-alive connection), so the listener
// and its connections are wrapped: more than max_connections open get 503 and are closed, a
// head over max_header_bytes (counted here, up to its empty line) gets 431, a header timeout
// after part of a head gets 408, net/http's own 431 and 400 answers are replaced by the
// mirror's, and a connection refused this way lingers before it closes so that the answer is
// not lost to a reset. The body deadline and size are the handler's (serve.go).

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
	maxHead   int // max_header_bytes
	open      atomic.Int64
	answers   *limitAnswers
	rejected  atomic.Int64        // over the connection cap
	refusedHd atomic.Int64        // 431, 408 on the head
	report    func(reason string) // an edge frame to the mirror (nil: none)
}

func (l *limitListener) edge(reason string) {
	if l.report != nil {
		l.report(reason)
	}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Load() >= l.max {
			l.rejected.Add(1)
			l.edge(edgeConnectionCap)
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
	_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(answer); err != nil {
		c.Close()
		return
	}
	lingerClose(c)
}

// limitConn is one client connection: it knows whether a handler is running (active) and how
// many bytes of a head arrived since the last request.
type limitConn struct {
	net.Conn
	l         *limitListener
	mu        sync.Mutex
	active    bool
	headBytes int  // bytes of the head under way
	headDone  bool // its empty line came
	lineStart int  // 1: after a LF, 2: after LF CR (an empty line ends the head)
	answered  bool // the connection got a refusal of ours
	served    bool // a request's head came on it (a silent close after is not counted)
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
	c.active, c.served = true, true
	c.mu.Unlock()
}

// end: the handler returned; what is read next is the next request's head.
func (c *limitConn) end() {
	c.mu.Lock()
	c.active, c.headBytes, c.headDone, c.lineStart = false, 0, false, 0
	c.mu.Unlock()
}

func (c *limitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active || c.answered {
		return n, err
	}
	if !c.headDone {
		for i, b := range p[:n] {
			switch {
			case b == '\n' && c.lineStart > 0: // an empty line: the head is whole
				c.headDone = true
			case b == '\n':
				c.lineStart = 1
			case b == '\r' && c.lineStart == 1:
				c.lineStart = 2
			default:
				c.lineStart = 0
			}
			if c.headDone {
				c.headBytes += i + 1
				break
			}
		}
		if !c.headDone {
			c.headBytes += n
		}
		if c.headBytes > c.l.maxHead {
			// the request line and headers are over max_header_bytes: 431, whatever net/http
			// has read of them (its own limit is looser on a kept-alive connection)
			c.refuse(c.l.answers.headerTooLarge, edgeHeaderTooLarge)
			return 0, io.EOF
		}
	}
	if err != nil && c.headBytes > 0 && errors.Is(err, os.ErrDeadlineExceeded) && !c.headDone {
		// part of a head, then nothing for header_timeout_s (net/http would close silently;
		// a connection that sent nothing is closed silently, as nginx does)
		c.refuse(c.l.answers.headerTimeout, edgeHeaderTimeout)
	} else if err != nil && c.headBytes == 0 && !c.served && errors.Is(err, os.ErrDeadlineExceeded) {
		// a connection that never sent a byte of a request: closed silently, counted
		c.served = true // once
		c.l.edge(edgeIdleClosed)
	}
	return n, err
}

// refuse writes a whole answer on the connection; its Close lingers so that the answer is not
// lost to a reset (the client may still be sending).
func (c *limitConn) refuse(answer []byte, reason string) {
	c.answered = true
	c.l.refusedHd.Add(1)
	c.l.edge(reason)
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Conn.Write(answer)
}

func (c *limitConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	active, answered := c.active, c.answered
	c.mu.Unlock()
	if answered { // net/http's answer to the head it could not finish: ours went first
		return len(p), nil
	}
	if !active {
		var answer []byte
		switch {
		case bytes.HasPrefix(p, goTooLarge):
			answer = c.l.answers.headerTooLarge
			c.l.refusedHd.Add(1)
			c.l.edge(edgeHeaderTooLarge)
			c.answered = true
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
	c.mu.Lock()
	answered := c.answered
	c.mu.Unlock()
	if answered {
		go lingerClose(c.Conn)
		return nil
	}
	return c.Conn.Close()
}

// lingerClose closes the writing side, reads (and drops) what the client still sends for a
// moment, then closes.
func lingerClose(c net.Conn) {
	defer c.Close()
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 4<<20))
}
