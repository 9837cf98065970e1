// Command shadow-ab-front is the native front of the shadow-ab mirror: it owns the client's
// connections and the incumbent's on the two generate routes, and tells the Python mirror what
// happened through a Unix socket (the tee). Everything else is proxied to the mirror's own
// plane. See README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"
)

type config struct {
	ListenFD                int               `json:"listen_fd"`
	Incumbent               string            `json:"incumbent"`
	Internal                string            `json:"internal"`
	Tee                     string            `json:"tee"`
	Routes                  map[string]string `json:"routes"`
	IncludeUsage            bool              `json:"include_usage"`
	HideResponseHeaders     []string          `json:"hide_response_headers"`
	MaxBodyBytes            int64             `json:"max_body_bytes"`
	MaxHeaderBytes          int               `json:"max_header_bytes"`
	HeaderTimeoutS          float64           `json:"header_timeout_s"`
	BodyTimeoutS            float64           `json:"body_timeout_s"`
	IdleTimeoutS            float64           `json:"idle_timeout_s"`
	SendTimeoutS            float64           `json:"send_timeout_s"`
	MaxConnections          int               `json:"max_connections"`
	ReadTimeoutS            *float64          `json:"read_timeout_s"`
	ConnectTimeoutS         float64           `json:"connect_timeout_s"`
	IncumbentMaxConnections int               `json:"incumbent_max_connections"`
	TeeQueue                int               `json:"tee_queue"`
}

var configKeys = []string{
	"listen_fd", "incumbent", "internal", "tee", "routes", "include_usage",
	"hide_response_headers", "max_body_bytes", "max_header_bytes", "header_timeout_s",
	"body_timeout_s", "idle_timeout_s", "send_timeout_s", "max_connections", "read_timeout_s",
	"connect_timeout_s", "incumbent_max_connections", "tee_queue",
}

// parseConfig reads the -config JSON: every key present, none unknown, values in range. The
// error names the key.
func parseConfig(data []byte) (*config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("-config is not a JSON object: %v", err)
	}
	var missing, unknown []string
	known := map[string]bool{}
	for _, k := range configKeys {
		known[k] = true
		if _, ok := raw[k]; !ok {
			missing = append(missing, k)
		}
	}
	for k := range raw {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	if len(missing) > 0 {
		return nil, fmt.Errorf("-config: missing key(s) %s (every key must be present)", strings.Join(missing, ", "))
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("-config: unknown key(s) %s", strings.Join(unknown, ", "))
	}
	c := &config{}
	for _, k := range configKeys {
		// one key at a time, so that a type error names its key
		one, _ := json.Marshal(map[string]json.RawMessage{k: raw[k]})
		if err := json.Unmarshal(one, c); err != nil {
			return nil, fmt.Errorf("-config: %s: %s is not the right type (%v)", k, raw[k], err)
		}
	}
	positive := map[string]float64{
		"max_body_bytes": float64(c.MaxBodyBytes), "max_header_bytes": float64(c.MaxHeaderBytes),
		"header_timeout_s": c.HeaderTimeoutS, "body_timeout_s": c.BodyTimeoutS,
		"idle_timeout_s": c.IdleTimeoutS, "send_timeout_s": c.SendTimeoutS,
		"max_connections": float64(c.MaxConnections), "connect_timeout_s": c.ConnectTimeoutS,
		"tee_queue": float64(c.TeeQueue),
	}
	for _, k := range configKeys {
		if v, ok := positive[k]; ok && !(v > 0) {
			return nil, fmt.Errorf("-config: %s must be > 0, got %s", k, raw[k])
		}
	}
	if c.IncumbentMaxConnections < 0 {
		return nil, fmt.Errorf("-config: incumbent_max_connections must be >= 0 (0: no limit), got %d", c.IncumbentMaxConnections)
	}
	if c.ReadTimeoutS != nil && !(*c.ReadTimeoutS > 0) {
		return nil, fmt.Errorf("-config: read_timeout_s must be > 0 or null, got %g", *c.ReadTimeoutS)
	}
	if c.ListenFD < 0 {
		return nil, fmt.Errorf("-config: listen_fd must be a file descriptor number, got %d", c.ListenFD)
	}
	for _, k := range []string{"incumbent", "internal"} {
		s := c.Incumbent
		if k == "internal" {
			s = c.Internal
		}
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("-config: %s must be an http(s) URL, got %q", k, redactURLs(s))
		}
	}
	if c.Tee == "" {
		return nil, fmt.Errorf("-config: tee must be the path of a Unix socket")
	}
	if len(c.Routes) == 0 {
		return nil, fmt.Errorf("-config: routes must name at least one generate path")
	}
	for path := range c.Routes {
		if canon, ok := canonicalPath(path); !ok || canon != path {
			return nil, fmt.Errorf("-config: routes: %q is not a canonical path", path)
		}
	}
	return c, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func main() {
	log.SetFlags(log.LstdFlags | log.LUTC)
	log.SetPrefix("shadow-ab-front: ")
	cfgText := flag.String("config", "", "the configuration, a JSON object (see front/README.md)")
	flag.Parse()
	cfg, err := parseConfig([]byte(*cfgText))
	if err != nil {
		fmt.Fprintln(os.Stderr, "shadow-ab-front:", err)
		os.Exit(2)
	}
	file := os.NewFile(uintptr(cfg.ListenFD), "client")
	ln, err := net.FileListener(file) // a copy: the inherited descriptor is closed, so that
	file.Close()                      // the socket stops listening when the front stops
	if err != nil {
		fmt.Fprintf(os.Stderr, "shadow-ab-front: -config: listen_fd %d is not a listening socket: %v\n", cfg.ListenFD, err)
		os.Exit(2)
	}
	stopProfile := func() {}
	if path := os.Getenv("SHADOW_AB_FRONT_CPUPROFILE"); path != "" {
		stopProfile = cpuProfile(path)
	}
	stop := make(chan struct{})
	if !watchParent() {
		log.Printf("the process that started the front is gone: stopping")
		close(stop)
	}
	code := run(cfg, ln, stop)
	stopProfile()
	os.Exit(code)
}

// cpuProfile writes a pprof CPU profile of the whole run to path (SHADOW_AB_FRONT_CPUPROFILE,
// a diagnostic: `go tool pprof shadow-ab-front path`); the function returned ends it.
func cpuProfile(path string) func() {
	out, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(out)
	}
	if err != nil {
		log.Printf("SHADOW_AB_FRONT_CPUPROFILE: %v: no profile", err)
		return func() {}
	}
	log.Printf("writing a CPU profile to %s", path)
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}
}

// run serves ln until SIGTERM/SIGINT (or stop is closed), then drains: stops accepting, lets
// the answers in flight finish (a second signal stops them), flushes the tee (up to 5 s).
func run(cfg *config, ln net.Listener, stop <-chan struct{}) int {
	f, err := newFront(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shadow-ab-front:", err)
		return 2
	}
	return f.serve(ln, stop)
}

func (f *front) serve(ln net.Listener, stop <-chan struct{}) int {
	cfg := f.cfg
	srv, lim := f.server(ln)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lim) }()
	log.Printf("serving clients on %s (incumbent %s, tee %s)", ln.Addr(), redactURLs(cfg.Incumbent), cfg.Tee)
	code := 0
	select {
	case <-sigs:
	case <-stop:
	case err := <-served:
		log.Printf("stopped serving: %v", err)
		code = 1
	}
	log.Printf("stopping: draining the answers in flight")
	go func() {
		select {
		case <-sigs:
			log.Printf("second signal: closing the connections in flight")
			_ = srv.Close()
		case <-f.stopped:
		}
	}()
	if err := srv.Shutdown(context.Background()); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Printf("shutdown: %v", err)
	}
	close(f.stopped)
	f.tee.close(5 * time.Second)
	log.Printf("stopped: %d generate requests, %d tee frames dropped, %d connections over the cap, %d heads refused",
		f.seq.Load(), f.tee.total.Load(), lim.rejected.Load(), lim.refusedHd.Load())
	return code
}
