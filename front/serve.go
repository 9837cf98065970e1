package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The client's path on the generate routes (a port of mirror/wire.py's _Exchange): the request
// read whole, a pair id, the incumbent asked, its answer relayed chunk by chunk (flushed as each
// arrives, the usage event hidden where the front asked for it), and the tee told.

type front struct {
	cfg      *config
	inc      *incumbent
	internal *httputil.ReverseProxy
	tee      *tee
	answers  limitAnswers
	drop     map[string]bool // response headers never passed to the client
	seq      atomic.Uint64
	stopped  chan struct{}
}

func newFront(c *config) (*front, error) {
	f := &front{
		cfg:      c,
		inc:      newIncumbent(c),
		internal: newInternalProxy(c),
		answers:  newLimitAnswers(c),
		drop:     map[string]bool{},
		stopped:  make(chan struct{}),
	}
	for _, h := range c.HideResponseHeaders {
		f.drop[strings.ToLower(h)] = true
	}
	f.tee = newTee(c.Tee, c.TeeQueue)
	return f, nil
}

// server is the http.Server on ln, with the limits (limitListener, limitConn).
func (f *front) server(ln net.Listener) (*http.Server, *limitListener) {
	c := f.cfg
	lim := &limitListener{Listener: ln, max: int64(c.MaxConnections), maxHead: c.MaxHeaderBytes, answers: &f.answers,
		report: func(reason string) { f.tee.send(&edgeFrame{K: "edge", Reason: reason}) }}
	srv := &http.Server{
		Handler:           f,
		ReadHeaderTimeout: seconds(c.HeaderTimeoutS),
		IdleTimeout:       seconds(c.IdleTimeoutS),
		MaxHeaderBytes:    c.MaxHeaderBytes, // limitConn's count is the exact one
		// "OPTIONS *" goes to the mirror's plane (404 there) like any other non-generate request
		DisableGeneralOptionsHandler: true,
		ConnContext: func(ctx context.Context, conn net.Conn) context.Context {
			if lc, ok := conn.(*limitConn); ok {
				return context.WithValue(ctx, connKey{}, lc)
			}
			return ctx
		},
	}
	return srv, lim
}

// canonicalPath is mirror.routes.canonical_path: empty and "." segments removed, ".." resolved
// (never above the root); ok false when the path holds control characters.
func canonicalPath(path string) (string, bool) {
	for i := 0; i < len(path); i++ {
		if path[i] < 0x20 || path[i] == 0x7f {
			return "", false
		}
	}
	var segs []string
	for _, s := range strings.Split(path, "/") {
		switch s {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, s)
		}
	}
	return "/" + strings.Join(segs, "/"), true
}

// routeOf is the generate route a (percent-decoded) path is, or "".
func (f *front) routeOf(path string) string {
	if _, ok := f.cfg.Routes[path]; ok {
		return path
	}
	if canon, ok := canonicalPath(path); ok {
		if _, ok := f.cfg.Routes[canon]; ok {
			return canon
		}
	}
	return ""
}

func newUUID4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if lc := connOf(r.Context()); lc != nil {
		lc.begin()
		defer lc.end()
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // a deadline of the connection's previous answer
	route := ""
	if r.Method == http.MethodPost {
		route = f.routeOf(r.URL.Path)
	}
	body, ok := f.readBody(w, r, rc, route)
	if !ok {
		return
	}
	if route == "" {
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		if len(body) == 0 {
			r.Body = http.NoBody
		}
		w.Header()["Date"] = nil // only the mirror's own, if it sends one
		f.internal.ServeHTTP(w, r)
		return
	}
	f.generate(w, r, rc, route, body)
}

// readBody reads the request's body whole, within body_timeout_s and max_body_bytes (408 and
// 413 otherwise, the connection closed); ok false when the request was answered.
func (f *front) readBody(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, route string) ([]byte, bool) {
	limit := f.cfg.MaxBodyBytes
	tooLarge := r.ContentLength > limit
	var body []byte
	if !tooLarge && r.ContentLength != 0 {
		_ = rc.SetReadDeadline(time.Now().Add(seconds(f.cfg.BodyTimeoutS)))
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
		switch {
		case int64(len(body)) > limit:
			tooLarge = true
		case errors.Is(err, os.ErrDeadlineExceeded):
			// the deadline stays past: net/http reads no more of this body
			f.tee.send(&edgeFrame{K: "edge", Reason: edgeBodyTimeout})
			writeError(w, http.StatusRequestTimeout, f.answers.bodyTimeout, "", "")
			return nil, false
		case err != nil: // the client left, or sent a body that does not parse
			_ = rc.SetReadDeadline(time.Now())
			if r.Context().Err() == nil {
				writeError(w, http.StatusBadRequest, "the request's body could not be read: "+err.Error(), "", "")
			}
			return nil, false
		default:
			_ = rc.SetReadDeadline(time.Time{})
		}
	}
	if !tooLarge {
		return body, true
	}
	_ = rc.SetReadDeadline(time.Now()) // net/http reads no more of this body
	msg := fmt.Sprintf("request body is larger than the mirror's limit of %d bytes (max_body_bytes)", limit)
	if route == "" {
		writeError(w, http.StatusRequestEntityTooLarge, msg, "RequestTooLarge", "")
		return nil, false
	}
	// counted by the mirror as skipped_too_large: a req frame without the body, and its end
	ex := f.newExchange(r, route, []byte{})
	ex.req.TooLarge = true
	ex.teeReq()
	writeError(w, http.StatusRequestEntityTooLarge, msg, "RequestTooLarge", ex.pair)
	code := http.StatusRequestEntityTooLarge
	ex.httpStatus, ex.clientCode, ex.status = &code, code, "http_error"
	ex.teeEnd()
	return nil, false
}

// exchange is one generate request's incumbent exchange (wire.py's _Exchange).
type exchange struct {
	f          *front
	pair       string
	req        *reqFrame
	queued     bool // its req frame was queued (else its end frame is dropped too)
	ready      time.Time
	t0         time.Time
	status     string
	httpStatus *int
	clientCode int
	err        string
	sse        bool
	chunks     []chunk
	parts      [][]byte
	lastT      *float64
	addedS     *float64
	hider      *usageHider
	gone       bool
	sendLate   bool // the client took none of its answer for send_timeout_s
}

func (f *front) newExchange(r *http.Request, route string, body []byte) *exchange {
	now := time.Now()
	headers := make([]header, 0, len(r.Header)+1)
	if r.Host != "" {
		headers = append(headers, header{"host", r.Host})
	}
	headers = append(headers, headerList(r.Header)...)
	ex := &exchange{f: f, pair: newUUID4(), ready: now, status: "ok"}
	ex.req = &reqFrame{
		K: "req", ID: f.seq.Add(1), Pair: ex.pair, Route: route, Path: r.RequestURI,
		Headers: headers, Body: body, Wall: unixSeconds(now),
	}
	return ex
}

func (ex *exchange) teeReq() { ex.queued = ex.f.tee.send(ex.req) }

func (ex *exchange) teeEnd() {
	if !ex.queued {
		ex.f.tee.drop(1)
		return
	}
	end := &endFrame{
		K: "end", ID: ex.req.ID, Status: ex.status, HTTPStatus: ex.httpStatus,
		ClientCode: ex.clientCode, SSE: ex.sse, Chunks: ex.chunks, Parts: ex.parts,
		LastT: ex.lastT, AddedS: ex.addedS, Gone: ex.gone, SendTimeout: ex.sendLate,
	}
	if ex.err != "" {
		e := ex.err
		end.Error = &e
	}
	if end.Chunks == nil {
		end.Chunks = []chunk{}
	}
	if end.Parts == nil {
		end.Parts = [][]byte{}
	}
	if ex.hider != nil {
		end.HeldS = ex.hider.heldS
	}
	ex.f.tee.send(end)
}

// statusOf is the mirror's status_of: an HTTP status under 400 is "ok".
func statusOf(code int) string {
	if code < 400 {
		return "ok"
	}
	return "http_error"
}

func (ex *exchange) since(t time.Time) float64 { return t.Sub(ex.t0).Seconds() }

// generate asks the incumbent and relays its answer; the tee gets req now and end at the end.
func (f *front) generate(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, route string, body []byte) {
	ex := f.newExchange(r, route, body)
	ex.teeReq()
	abort := false
	defer func() {
		ex.teeEnd()
		if abort { // the client sees the answer cut, as from the incumbent
			panic(http.ErrAbortHandler)
		}
	}()

	incBody, strip := body, false
	if f.cfg.IncludeUsage {
		if nb := withStreamUsage(body); nb != nil {
			incBody, strip = nb, true
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var t0 atomic.Int64 // unix nanoseconds the request was written (monotonic offset below)
	var reused atomic.Bool
	start := time.Now()
	trace := &httptrace.ClientTrace{
		GotConn:      func(i httptrace.GotConnInfo) { reused.Store(i.Reused) },
		WroteRequest: func(httptrace.WroteRequestInfo) { t0.Store(int64(time.Since(start))) },
	}
	tctx := httptrace.WithClientTrace(ctx, trace)
	u := f.inc.url(route, r.URL.RawQuery)
	headers := upstreamHeaders(ex.req.Headers, ex.pair) // (without the client's host)
	var resp *http.Response
	var err error
	for attempt := 0; ; attempt++ {
		reused.Store(false)
		resp, err = f.inc.transport.RoundTrip(f.inc.request(tctx, u, headers, incBody))
		if err != nil && attempt == 0 && reused.Load() && ctx.Err() == nil && !isTimeout(err) {
			continue // a kept-alive connection the incumbent had closed: once more, on a new one
		}
		break
	}
	ex.t0 = start.Add(time.Duration(t0.Load()))
	if t0.Load() == 0 {
		ex.t0 = time.Now()
	}
	if err != nil {
		switch {
		case r.Context().Err() != nil:
			ex.status, ex.err, ex.gone = "cancelled", "the client disconnected", true
			abort = true // no answer at all (net/http would write an empty 200)
		case isTimeout(err):
			msg := err.Error()
			if strings.Contains(msg, "awaiting response headers") && f.cfg.ReadTimeoutS != nil {
				msg = fmt.Sprintf("no byte from the incumbent in %ss", pyG(*f.cfg.ReadTimeoutS))
			}
			ex.answerError(w, rc, 504, "timeout: "+msg, "timeout", "the incumbent did not answer", "GatewayTimeout")
		default:
			ex.answerError(w, rc, 502, err.Error(), "connection_error",
				"the incumbent is unreachable: "+redactURLs(err.Error()), "BadGateway")
		}
		return
	}
	defer resp.Body.Close()
	abort = ex.relay(w, r, rc, resp, strip, cancel)
}

func (ex *exchange) answerError(w http.ResponseWriter, rc *http.ResponseController, code int, errText, status, message, errType string) {
	ex.status, ex.err, ex.clientCode = status, errText, code
	_ = rc.SetWriteDeadline(time.Now().Add(seconds(ex.f.cfg.SendTimeoutS)))
	writeError(w, code, message, errType, ex.pair)
}

// relay passes the incumbent's answer on; true when the client's connection must be cut.
func (ex *exchange) relay(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, resp *http.Response, strip bool, cancel context.CancelFunc) bool {
	f := ex.f
	code := resp.StatusCode
	ex.httpStatus, ex.clientCode, ex.status = &code, code, statusOf(code)
	ctype := strings.ToLower(strings.TrimSpace(strings.SplitN(resp.Header.Get("Content-Type"), ";", 2)[0]))
	encoded := false
	if v, ok := resp.Header["Content-Encoding"]; ok && len(v) > 0 {
		encoded = strings.ToLower(strings.TrimSpace(v[len(v)-1])) != "identity"
	}
	ex.sse = ctype == "text/event-stream" && !encoded
	rechunk := strip && ex.sse
	h := w.Header()
	clear(h)
	h["Date"] = nil         // none the incumbent did not send
	h["Content-Type"] = nil // no sniffing: the incumbent's own, lower-case, below
	for _, kv := range clientHeaders(headerList(resp.Header), ex.pair, rechunk, f.drop) {
		name := kv[0]
		if name == "content-length" {
			name = "Content-Length" // net/http frames the body by it
		}
		h[name] = append(h[name], kv[1])
	}
	if rechunk {
		ex.hider = &usageHider{}
	}
	send := seconds(f.cfg.SendTimeoutS)
	var sendErr error
	write := func(b []byte) {
		if sendErr != nil {
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(send))
		if len(b) > 0 {
			if _, sendErr = w.Write(b); sendErr != nil {
				return
			}
		}
		sendErr = rc.Flush()
	}
	bodiless := code == 204 || code == 304 || code < 200
	w.WriteHeader(code)
	write(nil)

	var readTimer *time.Timer
	var readLate atomic.Bool
	if rt := f.cfg.ReadTimeoutS; rt != nil {
		readTimer = time.AfterFunc(seconds(*rt), func() { readLate.Store(true); cancel() })
		defer readTimer.Stop()
	}
	bp := readBuffers.Get().(*[]byte)
	defer readBuffers.Put(bp)
	buf := *bp
	first := true
	for sendErr == nil {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			arrived := time.Now()
			if readTimer != nil {
				readTimer.Reset(seconds(*f.cfg.ReadTimeoutS))
			}
			t := ex.since(arrived)
			ex.lastT = &t
			data := append([]byte(nil), buf[:n]...)
			out := data
			if ex.sse {
				ex.chunks = append(ex.chunks, chunk{t, data})
				if ex.hider != nil {
					out = ex.hider.feed(data, t)
				}
			} else if ex.status == "ok" || len(ex.parts) < 64 {
				ex.parts = append(ex.parts, data)
			}
			if len(out) > 0 && !bodiless {
				write(out)
			}
			if first {
				first = false
				added := ex.t0.Sub(ex.ready).Seconds() + time.Since(arrived).Seconds()
				ex.addedS = &added
			}
		}
		if err == io.EOF {
			ex.releaseHider(write)
			return sendErr != nil
		}
		if err != nil {
			switch {
			case readLate.Load():
				ex.status, ex.err = "timeout", fmt.Sprintf("timeout while reading: no byte from the incumbent in %ss", pyG(*f.cfg.ReadTimeoutS))
			case r.Context().Err() != nil:
				ex.status, ex.err, ex.gone = "cancelled", "the client disconnected", true
				return true
			default:
				ex.status, ex.err = "connection_error", "stream broke: "+err.Error()
			}
			ex.releaseHider(write)
			return true
		}
	}
	// the client is gone (or took none of its answer for send_timeout_s): the incumbent's
	// request is cancelled
	cancel()
	ex.status, ex.gone = "cancelled", true
	ex.err = "the client disconnected"
	if errors.Is(sendErr, os.ErrDeadlineExceeded) {
		ex.sendLate = true
		ex.err = fmt.Sprintf("the client took none of its answer for %ss (limits.send_timeout_s)", pyG(f.cfg.SendTimeoutS))
	}
	return true
}

// readBuffers are the buffers the incumbent's answers are read into (each chunk is copied out).
var readBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func (ex *exchange) releaseHider(write func([]byte)) {
	if ex.hider == nil {
		return
	}
	t := ex.since(time.Now())
	if rest := ex.hider.close(t); len(rest) > 0 {
		write(rest)
	}
}
