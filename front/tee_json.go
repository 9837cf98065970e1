package main

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"strconv"
)

// The tee frames' JSON, written by hand: encoding/json's reflection, and its re-checking of
// what chunk.MarshalJSON returns, were a tenth of the front's CPU. Each appendJSON writes the
// object json.Marshal writes for the frame's struct tags (the reference: tee_json_test.go
// checks that both decode equal), into a buffer the tee writer reuses.

func (f *reqFrame) appendJSON(b []byte) []byte {
	b = append(b, `{"k":`...)
	b = appendString(b, f.K)
	b = append(b, `,"id":`...)
	b = strconv.AppendUint(b, f.ID, 10)
	b = append(b, `,"pair":`...)
	b = appendString(b, f.Pair)
	b = append(b, `,"route":`...)
	b = appendString(b, f.Route)
	b = append(b, `,"path":`...)
	b = appendString(b, f.Path)
	b = append(b, `,"headers":`...)
	b = appendList(b, f.Headers, func(b []byte, h header) []byte {
		b = append(b, '[')
		b = appendString(b, h[0])
		b = append(b, ',')
		b = appendString(b, h[1])
		return append(b, ']')
	})
	b = append(b, `,"body":`...)
	b = appendBytes(b, f.Body)
	b = append(b, `,"too_large":`...)
	b = strconv.AppendBool(b, f.TooLarge)
	b = append(b, `,"wall":`...)
	b = appendFloat(b, f.Wall)
	b = append(b, `,"dropped":`...)
	b = strconv.AppendInt(b, f.Dropped, 10)
	return append(b, '}')
}

func (f *endFrame) appendJSON(b []byte) []byte {
	b = append(b, `{"k":`...)
	b = appendString(b, f.K)
	b = append(b, `,"id":`...)
	b = strconv.AppendUint(b, f.ID, 10)
	b = append(b, `,"status":`...)
	b = appendString(b, f.Status)
	b = append(b, `,"http_status":`...)
	if f.HTTPStatus == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(*f.HTTPStatus), 10)
	}
	b = append(b, `,"client_code":`...)
	b = strconv.AppendInt(b, int64(f.ClientCode), 10)
	b = append(b, `,"error":`...)
	if f.Error == nil {
		b = append(b, "null"...)
	} else {
		b = appendString(b, *f.Error)
	}
	b = append(b, `,"sse":`...)
	b = strconv.AppendBool(b, f.SSE)
	b = append(b, `,"chunks":`...)
	b = appendList(b, f.Chunks, func(b []byte, c chunk) []byte { return c.appendJSON(b) })
	b = append(b, `,"parts":`...)
	b = appendList(b, f.Parts, appendBytes)
	b = append(b, `,"last_t":`...)
	b = appendOptFloat(b, f.LastT)
	b = append(b, `,"added_s":`...)
	b = appendOptFloat(b, f.AddedS)
	b = append(b, `,"held_s":`...)
	b = appendOptFloat(b, f.HeldS)
	b = append(b, `,"gone":`...)
	b = strconv.AppendBool(b, f.Gone)
	b = append(b, `,"send_timeout":`...)
	b = strconv.AppendBool(b, f.SendTimeout)
	b = append(b, `,"dropped":`...)
	b = strconv.AppendInt(b, f.Dropped, 10)
	return append(b, '}')
}

func (f *edgeFrame) appendJSON(b []byte) []byte {
	b = append(b, `{"k":`...)
	b = appendString(b, f.K)
	b = append(b, `,"reason":`...)
	b = appendString(b, f.Reason)
	b = append(b, `,"dropped":`...)
	b = strconv.AppendInt(b, f.Dropped, 10)
	return append(b, '}')
}

// appendJSON: [seconds since t0, "<base64>"].
func (c chunk) appendJSON(b []byte) []byte {
	b = append(b, '[')
	b = appendFloat(b, c.T)
	b = append(b, ',')
	b = appendBytes(b, c.Data)
	return append(b, ']')
}

func (c chunk) MarshalJSON() ([]byte, error) { return c.appendJSON(nil), nil }

// appendList: xs as encoding/json writes a slice, each element by each; null for nil.
func appendList[T any](b []byte, xs []T, each func([]byte, T) []byte) []byte {
	if xs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = each(b, x)
	}
	return append(b, ']')
}

// appendString: s as a JSON string. Printable ASCII without '"' or '\' (pair ids, routes,
// statuses, most headers) is written as it is; anything else goes through encoding/json (its
// escapes, invalid UTF-8 as U+FFFD).
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendBytes: p as encoding/json writes a []byte: base64 text, null for nil.
func appendBytes(b []byte, p []byte) []byte {
	if p == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, p)
	return append(b, '"')
}

// appendFloat: the shortest text that reads back as f (no NaN or infinity: times are finite).
func appendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	return strconv.AppendFloat(b, f, format, -1, 64)
}

func appendOptFloat(b []byte, f *float64) []byte {
	if f == nil {
		return append(b, "null"...)
	}
	return appendFloat(b, *f)
}
