package main

import (
	"net/http"
	"sort"
	"strings"
)

// Which headers cross the front, in each direction: mirror/headers.py.

const pairHeader = "x-shadow-pair-id"

var hopByHop = map[string]bool{
	"connection":          true,
	"keep-alive":          true,
	"proxy-authenticate":  true,
	"proxy-authorization": true,
	"proxy-connection":    true,
	"te":                  true,
	"trailer":             true,
	"transfer-encoding":   true,
	"upgrade":             true,
}

var requestDrop = map[string]bool{"host": true, "content-length": true, "expect": true, pairHeader: true}

// header is one (lower-case name, value) pair.
type header [2]string

// headerList is net/http's header map as a list of (lower-case name, value): names sorted
// (net/http keeps no order between names), each name's values in the order received.
func headerList(h http.Header) []header {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]header, 0, len(names)+1)
	for _, name := range names {
		low := strings.ToLower(name)
		for _, v := range h[name] {
			out = append(out, header{low, v})
		}
	}
	return out
}

// connectionTokens are the header names listed in Connection (also hop-by-hop).
func connectionTokens(headers []header) map[string]bool {
	out := map[string]bool{}
	for _, h := range headers {
		if h[0] == "connection" {
			for _, t := range strings.Split(h[1], ",") {
				if t = strings.ToLower(strings.TrimSpace(t)); t != "" {
					out[t] = true
				}
			}
		}
	}
	return out
}

// upstreamHeaders is upstream_headers: the client's end-to-end headers plus the pair header.
func upstreamHeaders(client []header, pair string) []header {
	extra := connectionTokens(client)
	out := make([]header, 0, len(client)+1)
	for _, h := range client {
		if hopByHop[h[0]] || requestDrop[h[0]] || extra[h[0]] {
			continue
		}
		out = append(out, h)
	}
	return append(out, header{pairHeader, pair})
}

// clientHeaders is client_headers: the incumbent's response headers for the client (lower-case
// names), without hop-by-hop ones, those in drop and the pair header, plus the pair header;
// without content-length when the body is rechunked.
func clientHeaders(upstream []header, pair string, rechunked bool, drop map[string]bool) []header {
	extra := connectionTokens(upstream)
	out := make([]header, 0, len(upstream)+1)
	for _, h := range upstream {
		low := h[0]
		if hopByHop[low] || low == pairHeader || drop[low] || extra[low] || (rechunked && low == "content-length") {
			continue
		}
		out = append(out, h)
	}
	return append(out, header{pairHeader, pair})
}
