package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
)

// The bodies of the answers the front gives itself: problem details (RFC 9457) that also carry
// an OpenAI-style "error" member, as mirror/problem.py writes them.

const problemJSON = "application/problem+json"

var openAIType = map[int]string{
	400: "invalid_request_error",
	404: "not_found_error",
	405: "invalid_request_error",
	408: "timeout_error",
	413: "RequestTooLarge",
	431: "invalid_request_error",
	502: "BadGateway",
	503: "service_unavailable",
	504: "GatewayTimeout",
}

type problemError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}

type problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail"`
	Error  problemError `json:"error"`
}

// problemBody is mirror/problem.py's problem_body: compact JSON, the members in its order.
func problemBody(status int, detail, errType string) []byte {
	title := http.StatusText(status)
	if title == "" {
		title = "Error"
	}
	if errType == "" {
		errType = openAIType[status]
		if errType == "" {
			errType = "error"
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // orjson does not escape <, > and &
	p := problem{"about:blank", title, status, detail, problemError{detail, errType, nil, status}}
	if err := enc.Encode(p); err != nil {
		panic(err) // strings and ints always encode
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// rejectBytes is mirror/limits.py's reject_bytes: a whole HTTP/1.1 answer that closes the
// connection, written on the raw connection (before or instead of net/http's own answer).
func rejectBytes(status int, detail string, extra ...[2]string) []byte {
	body := problemBody(status, detail, "")
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	b.WriteString("content-type: " + problemJSON + "\r\n")
	fmt.Fprintf(&b, "content-length: %d\r\n", len(body))
	b.WriteString("connection: close\r\n")
	for _, h := range extra {
		b.WriteString(h[0] + ": " + h[1] + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// badRequest is mirror/wire.py's answer to a request that does not parse.
var badRequest = []byte("HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n" +
	"content-length: 29\r\nconnection: close\r\n\r\nInvalid HTTP request received.")

// writeError answers with the front's own error (mirror/wire.py's error_answer) through net/http:
// the connection is closed after it. pair is empty when no pair exists yet.
func writeError(w http.ResponseWriter, status int, message, errType, pair string) {
	body := problemBody(status, message, errType)
	h := w.Header()
	clear(h)
	h["Date"] = nil
	h["Content-Type"] = []string{problemJSON}
	h["Content-Length"] = []string{fmt.Sprint(len(body))}
	h["Connection"] = []string{"close"}
	if pair != "" {
		h[pairHeader] = []string{pair}
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

var urlPassword = regexp.MustCompile(`(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'"<>]*):[^/\s@'"<>]*@`)

// redactURLs is shadow_ab.privacy.redact_urls: the password of every scheme://user:password@
// in text replaced by ***.
func redactURLs(text string) string {
	if !bytes.ContainsRune([]byte(text), '@') {
		return text
	}
	return urlPassword.ReplaceAllString(text, "$1:***@")
}
