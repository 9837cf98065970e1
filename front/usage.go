package main

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// The include_usage rule: mirror.rewrite.with_stream_usage(body, hideable=True) on the client's
// body as bytes. The body is edited in place of the one member that changes (never
// re-serialised), so the incumbent gets the client's bytes, key order and spacing, plus
// stream_options.include_usage.

// member is one member of a JSON object: its key and the byte span of its value.
type member struct {
	key        string
	start, end int
}

// objectMembers are the members of the JSON object raw (which must be valid JSON), in order;
// ok is false when raw is not an object.
func objectMembers(raw []byte) (members []member, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		end := int(dec.InputOffset())
		members = append(members, member{key, end - len(v), end})
	}
	return members, true
}

// lastMember is the span of key's value (the last one when the key repeats, as a JSON parser
// keeps it).
func lastMember(members []member, key string) (member, bool) {
	for i := len(members) - 1; i >= 0; i-- {
		if members[i].key == key {
			return members[i], true
		}
	}
	return member{}, false
}

// truthy is Python's truth value of a JSON value.
func truthy(raw []byte) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch x := v.(type) {
	case bool:
		return x
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return false
}

func splice(b []byte, start, end int, with string) []byte {
	out := make([]byte, 0, len(b)-(end-start)+len(with))
	out = append(out, b[:start]...)
	out = append(out, with...)
	return append(out, b[end:]...)
}

// withStreamUsage returns the body with stream_options.include_usage set, or nil when nothing
// changes: not a JSON object, not "stream": true, include_usage already truthy, stream_options
// not an object (or null), or (what the front could not hide from the client) stream_options
// without an include_usage key or with a truthy continuous_usage_stats.
func withStreamUsage(body []byte) []byte {
	if !utf8.Valid(body) || !json.Valid(body) {
		return nil
	}
	members, ok := objectMembers(body)
	if !ok {
		return nil
	}
	stream, ok := lastMember(members, "stream")
	if !ok || string(body[stream.start:stream.end]) != "true" {
		return nil
	}
	so, ok := lastMember(members, "stream_options")
	if !ok {
		end := bytes.LastIndexByte(body, '}')
		return splice(body, end, end, `,"stream_options":{"include_usage":true}`)
	}
	soRaw := body[so.start:so.end]
	if string(soRaw) == "null" {
		return splice(body, so.start, so.end, `{"include_usage":true}`)
	}
	inner, ok := objectMembers(soRaw)
	if !ok {
		return nil
	}
	iu, ok := lastMember(inner, "include_usage")
	if !ok || truthy(soRaw[iu.start:iu.end]) {
		return nil
	}
	if cus, ok := lastMember(inner, "continuous_usage_stats"); ok && truthy(soRaw[cus.start:cus.end]) {
		return nil
	}
	return splice(body, so.start+iu.start, so.start+iu.end, "true")
}
