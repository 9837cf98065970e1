package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"
)

// The incumbent (a keep-alive pool with the connect timeout and the connection cap) and the
// mirror's internal plane (a reverse proxy for everything that is not a generate request).

type incumbent struct {
	base      *url.URL // without user info; the client's path is appended to its path
	host      string   // the Host header: host, or host:port when the port is not the scheme's
	auth      string   // "Basic ..." from the URL's user info, for requests without authorization
	transport *http.Transport
}

func newIncumbent(c *config) *incumbent {
	u, _ := url.Parse(c.Incumbent) // checked by parseConfig
	inc := &incumbent{}
	if u.User != nil {
		pw, _ := u.User.Password()
		inc.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
	}
	base := *u
	base.User = nil
	base.Path = strings.TrimRight(base.Path, "/")
	base.RawPath = ""
	inc.base = &base
	port := u.Port()
	if port == "" || (u.Scheme == "http" && port == "80") || (u.Scheme == "https" && port == "443") {
		inc.host = u.Hostname()
		if strings.Contains(inc.host, ":") {
			inc.host = "[" + inc.host + "]"
		}
	} else {
		inc.host = u.Host
	}
	var header time.Duration
	if c.ReadTimeoutS != nil {
		header = seconds(*c.ReadTimeoutS)
	}
	idle := c.IncumbentMaxConnections // 0: no limit (the mirror's default), keep up to 1024 idle
	if idle == 0 {
		idle = 1024
	}
	inc.transport = &http.Transport{
		DialContext:           (&net.Dialer{Timeout: seconds(c.ConnectTimeoutS), KeepAlive: 30 * time.Second}).DialContext,
		MaxConnsPerHost:       c.IncumbentMaxConnections,
		MaxIdleConns:          idle,
		MaxIdleConnsPerHost:   idle,
		IdleConnTimeout:       4 * time.Second, // the mirror's incumbent.keepalive_timeout_s default
		ResponseHeaderTimeout: header,          // read_timeout_s before the head
		DisableCompression:    true,            // the client's Accept-Encoding, or none
		ForceAttemptHTTP2:     false,
		TLSHandshakeTimeout:   seconds(c.ConnectTimeoutS),
		ExpectContinueTimeout: 0,
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        64 << 10,
	}
	return inc
}

// url is the incumbent's URL for a canonical route and the client's raw query.
func (inc *incumbent) url(route, rawQuery string) *url.URL {
	u := *inc.base
	u.Path = inc.base.Path + route
	u.RawQuery = rawQuery
	return &u
}

// request is the incumbent's request: the client's end-to-end headers (upstreamHeaders, names
// as received in lower case), the Host of the incumbent, the URL's credentials when the client
// sent no authorization, and the body's length.
func (inc *incumbent) request(ctx context.Context, u *url.URL, headers []header, body []byte) *http.Request {
	h := make(http.Header, len(headers)+2)
	auth := inc.auth
	for _, kv := range headers {
		name := kv[0]
		switch name {
		case "user-agent":
			name = "User-Agent" // net/http writes its own unless the canonical key is there
		case "authorization":
			auth = ""
		}
		h[name] = append(h[name], kv[1])
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""} // none (net/http would send Go-http-client/1.1)
	}
	if auth != "" {
		h["authorization"] = []string{auth}
	}
	req := &http.Request{
		Method:        http.MethodPost,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Host:          inc.host,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		GetBody: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(body)), nil
		},
	}
	if len(body) == 0 {
		req.Body = http.NoBody
	}
	return req.WithContext(ctx)
}

// isTimeout: a connect timeout or no head within read_timeout_s.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// newInternalProxy passes a request to the mirror's own plane unchanged: no X-Forwarded-*
// added (the client's own are kept), the client's Host, hop-by-hop headers removed as
// net/http does, each write flushed.
func newInternalProxy(c *config) *httputil.ReverseProxy {
	target, _ := url.Parse(c.Internal)
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			for _, k := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v, ok := pr.In.Header[k]; ok {
					pr.Out.Header[k] = v
				}
			}
		},
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: seconds(c.ConnectTimeoutS)}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client left
			}
			writeError(w, http.StatusBadGateway, "the mirror's own plane is unreachable: "+
				redactURLs(err.Error())+" (the mirror may be restarting: retry shortly)", "BadGateway", "")
		},
	}
}
