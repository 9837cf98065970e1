package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"unicode/utf8"
)

// Server-sent events parsed incrementally, and the usage hider: a port of mirror/sse.py
// (SSEParser, UsageHider and the helpers they use), byte for byte in what the client gets.

var (
	done          = []byte("[DONE]")
	fingerprintRe = regexp.MustCompile(`(,[ \t\n\r\f\v]*)?("system_fingerprint"[ \t\n\r\f\v]*:[ \t\n\r\f\v]*"(?:[^"\\]|\\.)*")`)
)

const fingerprint = "system_fingerprint"

// sseEvent is one dispatched event (or, with hasData false, bytes that dispatched nothing).
type sseEvent struct {
	data    []byte // the data: lines joined with \n
	hasData bool
	raw     []byte // the exact bytes from the end of the previous event to this one's blank line
	event   string
}

// sseParser is mirror.sse.SSEParser: feed chunks, get the events they complete.
type sseParser struct {
	buf     []byte
	start   int // where the current (not yet dispatched) event's bytes begin
	pos     int // where the next line begins
	data    [][]byte
	hasData bool
	event   string
}

func (p *sseParser) feed(chunk []byte) []sseEvent {
	if len(p.buf) == 0 && bytes.IndexByte(chunk, '\r') < 0 && !bytes.Contains(chunk, []byte("\n\n\n")) &&
		(len(chunk) == 0 || chunk[0] != '\n') {
		return p.feedLF(chunk)
	}
	return p.feedAny(chunk)
}

func cut1space(b []byte) []byte {
	if len(b) > 0 && b[0] == ' ' {
		return b[1:]
	}
	return b
}

// feedLF is the common case, fast: LF line ends, every event starting in this chunk.
func (p *sseParser) feedLF(chunk []byte) []sseEvent {
	blocks := bytes.Split(chunk, []byte("\n\n"))
	var out []sseEvent
	for _, block := range blocks[:len(blocks)-1] {
		var data [][]byte
		event := ""
		for _, line := range bytes.Split(block, []byte("\n")) {
			switch {
			case bytes.HasPrefix(line, []byte("data:")):
				data = append(data, cut1space(line[5:]))
			case string(line) == "data":
				data = append(data, []byte{})
			case bytes.HasPrefix(line, []byte("event:")):
				event = string(cut1space(line[6:]))
			}
		}
		e := sseEvent{raw: append(append([]byte{}, block...), '\n', '\n'), event: event}
		if data != nil {
			e.hasData = true
			e.data = bytes.Join(data, []byte("\n"))
		}
		out = append(out, e)
	}
	if rest := blocks[len(blocks)-1]; len(rest) > 0 {
		out = append(out, p.feedAny(rest)...)
	}
	return out
}

func (p *sseParser) feedAny(chunk []byte) []sseEvent {
	p.buf = append(p.buf, chunk...)
	buf := p.buf
	var out []sseEvent
	n := len(buf)
	pos := p.pos
	for pos < n {
		lf := bytes.IndexByte(buf[pos:], '\n')
		if lf >= 0 {
			lf += pos
		}
		limit := n
		if lf >= 0 {
			limit = lf
		}
		cr := bytes.IndexByte(buf[pos:limit], '\r')
		var end, next int
		if cr >= 0 {
			cr += pos
			if cr+1 == n {
				break // a trailing CR: wait for the next byte (it may be CRLF)
			}
			end = cr
			if buf[cr+1] == '\n' {
				next = cr + 2
			} else {
				next = cr + 1
			}
		} else if lf >= 0 {
			end = lf
			next = lf + 1
		} else {
			break
		}
		if end == pos { // a blank line: dispatch
			out = append(out, p.dispatch(append([]byte{}, buf[p.start:next]...)))
			p.start = next
		} else {
			p.field(buf[pos:end])
		}
		pos = next
	}
	// Keep only the bytes of the event under way.
	if p.start > 0 {
		p.buf = append(buf[:0:0], buf[p.start:]...)
		pos -= p.start
		p.start = 0
	}
	p.pos = pos
	return out
}

// idle: no unfinished event is held (the next byte starts a new event).
func (p *sseParser) idle() bool { return len(p.buf) == 0 }

// pending: bytes received that no event has carried yet.
func (p *sseParser) pending() []byte { return append([]byte{}, p.buf...) }

func (p *sseParser) field(line []byte) {
	if len(line) > 0 && line[0] == ':' {
		return // a comment
	}
	name, value, colon := bytes.Cut(line, []byte(":"))
	if colon {
		value = cut1space(value)
	}
	switch string(name) {
	case "data":
		p.data = append(p.data, append([]byte{}, value...))
		p.hasData = true
	case "event":
		p.event = string(value)
	}
}

func (p *sseParser) dispatch(raw []byte) sseEvent {
	e := sseEvent{raw: raw, event: p.event}
	if p.hasData {
		e.hasData = true
		e.data = bytes.Join(p.data, []byte("\n"))
		if e.data == nil {
			e.data = []byte{}
		}
	}
	p.data = nil
	p.hasData = false
	p.event = ""
	return e
}

// keyThen is mirror/sse.py's regexps for an empty "choices" list (key `"choices"`, then
// ":[]") and a string "finish_reason" (then `:"`): b holds key followed by the bytes of then,
// with Python's \s ([ \t\n\r\f\v]) between them, and in a raw chunk (raw) also the "data:"
// that starts an event's continued line. A scan, not a regexp: it runs on every chunk.
func keyThen(b []byte, key, then string, raw bool) bool {
	for off := 0; ; {
		i := bytes.Index(b[off:], []byte(key))
		if i < 0 {
			return false
		}
		j := off + i + len(key)
		k := 0
		for ; k < len(then); k++ {
			j = skipSpace(b, j, raw)
			if j >= len(b) || b[j] != then[k] {
				break
			}
			j++
		}
		if k == len(then) {
			return true
		}
		off += i + 1
	}
}

func skipSpace(b []byte, j int, raw bool) int {
	for j < len(b) {
		switch c := b[j]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			j++
		case raw && bytes.HasPrefix(b[j:], []byte("data:")):
			j += 5
		default:
			return j
		}
	}
	return j
}

// pyStrip is Python's bytes.strip(): ASCII whitespace off both ends.
func pyStrip(b []byte) []byte {
	return bytes.Trim(b, " \t\n\r\v\f")
}

// decodeData is decode_data: the JSON object an event carries; nil for [DONE], non-JSON or
// non-object data (invalid UTF-8 is not JSON, as for orjson).
func decodeData(data []byte, has bool) map[string]any {
	if !has {
		return nil
	}
	s := pyStrip(data)
	if len(s) == 0 || bytes.Equal(s, done) || s[0] != '{' || !utf8.Valid(s) {
		return nil
	}
	var obj map[string]any
	if json.Unmarshal(s, &obj) != nil {
		return nil
	}
	return obj
}

// isUsageOnly is is_usage_only: empty choices and a usage object.
func isUsageOnly(data []byte, has bool) bool {
	if !has || !bytes.Contains(data, []byte(`"usage"`)) || !keyThen(data, `"choices"`, ":[]", false) {
		return false
	}
	obj := decodeData(data, has)
	if obj == nil {
		return false
	}
	choices, ok := obj["choices"].([]any)
	_, usage := obj["usage"].(map[string]any)
	return ok && len(choices) == 0 && usage
}

// finishesWithoutFingerprint is finishes_without_fingerprint: the event ends a choice and has
// no system_fingerprint key.
func finishesWithoutFingerprint(data []byte, has bool) bool {
	if !has || !keyThen(data, `"finish_reason"`, `:"`, false) {
		return false
	}
	obj := decodeData(data, has)
	if obj == nil {
		return false
	}
	if _, ok := obj[fingerprint]; ok {
		return false
	}
	choices, ok := obj["choices"].([]any)
	if !ok {
		return false
	}
	for _, c := range choices {
		if m, ok := c.(map[string]any); ok && m["finish_reason"] != nil {
			return true
		}
	}
	return false
}

// passesWhole is passes_whole: the chunk may be forwarded as it is (no usage event, no finish
// event can be in it, and it ends exactly at an event's end).
func passesWhole(p *sseParser, chunk []byte) bool {
	return p.idle() &&
		bytes.HasSuffix(chunk, []byte("\n\n")) &&
		bytes.IndexByte(chunk, '\r') < 0 &&
		(!bytes.Contains(chunk, []byte(`"usage"`)) || !keyThen(chunk, `"choices"`, ":[]", true)) &&
		!keyThen(chunk, `"finish_reason"`, `:"`, true)
}

// addField is add_field: field inserted before the closing brace of the event's JSON object.
func addField(raw, field []byte) []byte {
	end := bytes.LastIndexByte(raw, '}')
	if end < 0 || len(pyStrip(raw[end+1:])) > 0 {
		return raw
	}
	out := make([]byte, 0, len(raw)+len(field))
	out = append(out, raw[:end]...)
	out = append(out, field...)
	return append(out, raw[end:]...)
}

// fingerprintField is fingerprint_field: the ,"system_fingerprint":"..." member of a usage
// event as the engine wrote it, or nil.
func fingerprintField(data []byte, has bool) []byte {
	if !has {
		return nil
	}
	m := fingerprintRe.FindSubmatchIndex(data)
	if m == nil {
		return nil
	}
	obj := decodeData(data, has)
	if obj == nil {
		return nil
	}
	if _, ok := obj[fingerprint].(string); !ok {
		return nil
	}
	sep := []byte(",")
	if m[2] >= 0 {
		sep = data[m[2]:m[3]]
	}
	return append(append([]byte{}, sep...), data[m[4]:m[5]]...)
}

// usageHider is mirror.sse.UsageHider: the client's view of a stream whose usage event the
// front asked for and must hide, with the usage event's system_fingerprint given back to the
// finish events vLLM took it from. Times are seconds (heldS: how long events were held, nil
// when nothing was).
type usageHider struct {
	parser sseParser
	held   []sseEvent
	since  float64
	heldS  *float64
}

func (h *usageHider) holding() bool { return h.held != nil }

// feed returns the bytes of chunk the client gets now (possibly with earlier held events).
func (h *usageHider) feed(chunk []byte, t float64) []byte {
	if h.held == nil && passesWhole(&h.parser, chunk) {
		return chunk
	}
	var out [][]byte
	for _, e := range h.parser.feed(chunk) {
		switch {
		case isUsageOnly(e.data, e.hasData):
			out = append(out, h.release(fingerprintField(e.data, e.hasData), t)...)
		case h.held != nil:
			h.held = append(h.held, e)
		case finishesWithoutFingerprint(e.data, e.hasData):
			h.held = []sseEvent{e}
			h.since = t
		default:
			out = append(out, e.raw)
		}
	}
	return bytes.Join(out, nil)
}

func (h *usageHider) release(field []byte, t float64) [][]byte {
	held := h.held
	h.held = nil
	if held == nil {
		return nil
	}
	s := 0.0
	if h.heldS != nil {
		s = *h.heldS
	}
	s += max(0.0, t-h.since)
	h.heldS = &s
	out := make([][]byte, len(held))
	for i, e := range held {
		out[i] = e.raw
		if field != nil && finishesWithoutFingerprint(e.data, e.hasData) {
			out[i] = addField(e.raw, field)
		}
	}
	return out
}

// close: at the stream's end (or break), whatever is held, unchanged, then the bytes of an
// unfinished event.
func (h *usageHider) close(t float64) []byte {
	out := bytes.Join(h.release(nil, t), nil)
	return append(out, h.parser.pending()...)
}
