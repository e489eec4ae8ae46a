// Package faultproxy is an HTTP reverse proxy that injects the faults a real
// object-store server cannot be made to produce on demand: refused
// connections, throttling answers (HTTP 503/429), slow responses, and
// responses cut off mid-body. Tests put it between a payload store and a real
// S3, GCS or Azure server; it is test support, not part of Ferry's API.
// Silent is a TCP server that accepts and never answers (a broker or KMS
// that hangs).
package faultproxy

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// Mode is what the proxy does to the next requests.
type Mode int

const (
	// Pass forwards requests unchanged.
	Pass Mode = iota
	// Down closes each client connection without answering, as a server
	// that is down or restarting would.
	Down
	// Throttle answers with Status (503 or 429) and the S3 "SlowDown" error
	// body, as an object store that rate-limits.
	Throttle
	// Slow waits Delay before forwarding.
	Slow
	// CutBody forwards, but closes the connection after CutAfter bytes of a
	// response body.
	CutBody
)

// Proxy is a fault-injecting reverse proxy in front of one upstream.
type Proxy struct {
	srv      *httptest.Server
	upstream *url.URL
	rp       *httputil.ReverseProxy
	done     chan struct{}
	// rewriteHost: send the upstream's own Host header (servers that route
	// by Host, such as fake-gcs-server, need it; signed requests must not).
	rewriteHost bool

	mu       sync.Mutex
	mode     Mode
	budget   int // requests the mode still applies to; <0 = all
	status   int
	delay    time.Duration
	cutAfter int64
	log      []Request
	// upstreamFailures: requests passed through that the upstream did not
	// answer (the reverse proxy's own 502).
	upstreamFailures int
}

// Request records one request the proxy saw.
type Request struct {
	Method string
	Path   string
	Mode   Mode
	At     time.Time
}

// New starts a proxy in front of upstream (e.g. "http://127.0.0.1:7070").
// The Host header is kept as the client sent it, so request signatures (AWS
// SigV4, Azure shared key) stay valid.
func New(upstream string) (*Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	p := &Proxy{upstream: u, budget: -1, done: make(chan struct{})}
	p.rp = httputil.NewSingleHostReverseProxy(u)
	director := p.rp.Director
	p.rp.Director = func(r *http.Request) {
		director(r)
		p.mu.Lock()
		if p.rewriteHost {
			r.Host = u.Host
		}
		p.mu.Unlock()
	}
	p.rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		p.mu.Lock()
		p.upstreamFailures++
		p.mu.Unlock()
		w.WriteHeader(http.StatusBadGateway)
	}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	return p, nil
}

// UpstreamFailures returns how many requests passed through got no answer
// from the upstream (connection refused, reset, timed out: the proxy
// answered 502 itself).
func (p *Proxy) UpstreamFailures() int { p.mu.Lock(); defer p.mu.Unlock(); return p.upstreamFailures }

// URL is the proxy's base URL, "http://127.0.0.1:PORT".
func (p *Proxy) URL() string { return p.srv.URL }

// Addr is the proxy's "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.srv.Listener.Addr().String() }

// Close stops the proxy.
func (p *Proxy) Close() {
	close(p.done)
	p.srv.CloseClientConnections()
	p.srv.Close()
}

// Set switches to mode for the next n requests (n < 0: until the next Set);
// after them the proxy passes requests through again.
func (p *Proxy) Set(mode Mode, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.budget = mode, n
	if p.status == 0 {
		p.status = http.StatusServiceUnavailable
	}
}

// SetThrottleStatus sets the HTTP status Throttle answers with (503 or 429).
func (p *Proxy) SetThrottleStatus(code int) { p.mu.Lock(); p.status = code; p.mu.Unlock() }

// SetRewriteHost makes the proxy send the upstream's host in the Host
// header instead of the client's (for servers that route by Host and check
// no signature over it, such as fake-gcs-server).
func (p *Proxy) SetRewriteHost(on bool) { p.mu.Lock(); p.rewriteHost = on; p.mu.Unlock() }

// SetDelay sets how long Slow waits.
func (p *Proxy) SetDelay(d time.Duration) { p.mu.Lock(); p.delay = d; p.mu.Unlock() }

// SetCutAfter sets how many body bytes CutBody lets through.
func (p *Proxy) SetCutAfter(n int64) { p.mu.Lock(); p.cutAfter = n; p.mu.Unlock() }

// Requests returns the requests seen so far.
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.log...)
}

// Count returns how many requests were handled in mode m.
func (p *Proxy) Count(m Mode) int {
	n := 0
	for _, r := range p.Requests() {
		if r.Mode == m {
			n++
		}
	}
	return n
}

func (p *Proxy) next(r *http.Request) (Mode, int, time.Duration, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	mode := p.mode
	if p.budget == 0 {
		mode = Pass
	} else if p.budget > 0 {
		p.budget--
	}
	p.log = append(p.log, Request{Method: r.Method, Path: r.URL.Path, Mode: mode, At: time.Now()})
	return mode, p.status, p.delay, p.cutAfter
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	mode, status, delay, cut := p.next(r)
	switch mode {
	case Down:
		io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	case Throttle:
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/xml")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(status)
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
		return
	case Slow:
		// Read the body first: only then does net/http notice a client
		// that gives up (and cancel r.Context()).
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-p.done:
			t.Stop()
			return
		}
	case CutBody:
		p.rp.ServeHTTP(&cutWriter{ResponseWriter: w, left: cut}, r)
		return
	}
	p.rp.ServeHTTP(w, r)
}

// cutWriter passes the first left bytes of a body, then hijacks and closes
// the connection.
type cutWriter struct {
	http.ResponseWriter
	left int64
}

func (c *cutWriter) Write(b []byte) (int, error) {
	if int64(len(b)) <= c.left {
		c.left -= int64(len(b))
		return c.ResponseWriter.Write(b)
	}
	n, _ := c.ResponseWriter.Write(b[:c.left])
	c.left = 0
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	if hj, ok := c.ResponseWriter.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
		}
	}
	return n, net.ErrClosed
}
