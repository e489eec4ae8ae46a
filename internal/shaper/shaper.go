// Package shaper is a TCP proxy that gives every connection through it a
// bandwidth and a latency, like a real object store seen from a client: the
// local test servers answer at memory speed, real S3 serves about 90 MiB/s
// per GET stream a few milliseconds away, so the gain of concurrent ranged
// reads shows only through a shaper (scripts/bench shaped).
//
// Each direction of each connection is shaped on its own: bytes read from
// one side are held for Latency, then written to the other at no more than
// BytesPerSecond. The proxy counts the connections it accepts, so a test can
// tell whether a client reuses its connections (and whether the server lets
// it).
package shaper

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config: about one real S3 GET stream.
const (
	DefaultBytesPerSecond = 90 << 20
	DefaultLatency        = 3 * time.Millisecond
)

// chunk is the most bytes read, timed and written at once; queued bounds
// the chunks in flight per direction (so memory per connection is bounded:
// 2 × queued × chunk).
const (
	chunk  = 32 << 10
	queued = 64
	burst  = 2 * time.Millisecond
)

// Config configures Start.
type Config struct {
	// Listen is the address to listen on; "" means "127.0.0.1:0".
	Listen string
	// Upstream is the address every connection is forwarded to.
	Upstream string
	// BytesPerSecond is the rate of each direction of each connection;
	// 0 means DefaultBytesPerSecond, < 0 unlimited.
	BytesPerSecond int64
	// Latency delays each direction's bytes; 0 means DefaultLatency, < 0
	// none.
	Latency time.Duration
}

// Proxy is a running shaper.
type Proxy struct {
	ln       net.Listener
	cfg      Config
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
}

// Start listens and forwards every connection to cfg.Upstream, shaped.
func Start(cfg Config) (*Proxy, error) {
	if cfg.Upstream == "" {
		return nil, errors.New("shaper: no upstream address")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.BytesPerSecond == 0 {
		cfg.BytesPerSecond = DefaultBytesPerSecond
	}
	if cfg.Latency == 0 {
		cfg.Latency = DefaultLatency
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, cfg: cfg, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is how many connections the proxy has accepted.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Close stops listening, closes every connection and waits for them.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer client.Close()
	up, err := net.Dial("tcp", p.cfg.Upstream)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(client, true) || !p.track(up, true) {
		return
	}
	defer p.track(client, false)
	defer p.track(up, false)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(up, client) }()
	go func() { defer wg.Done(); p.pipe(client, up) }()
	wg.Wait()
}

type timedChunk struct {
	b  []byte
	at time.Time // when it was read
}

// pipe copies src to dst shaped; at src's end it half-closes dst, and on
// an error it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	ch := make(chan timedChunk, queued)
	free := make(chan []byte, queued+1)
	for range queued + 1 {
		free <- make([]byte, chunk)
	}
	go func() {
		defer close(ch)
		for {
			b := <-free
			n, err := src.Read(b)
			if n > 0 {
				ch <- timedChunk{b: b[:n], at: time.Now()}
			} else {
				free <- b
			}
			if err != nil {
				return
			}
		}
	}()
	next := time.Now() // when the rate allows the next byte
	failed := false
	for c := range ch {
		if !failed {
			if p.cfg.Latency > 0 {
				sleepUntil(c.at.Add(p.cfg.Latency))
			}
			if p.cfg.BytesPerSecond > 0 {
				// A late wake-up may be caught up by a short burst, no
				// more: idle time does not save up.
				if now := time.Now(); now.Sub(next) > burst {
					next = now.Add(-burst)
				}
				sleepUntil(next)
				next = next.Add(time.Duration(int64(len(c.b)) * int64(time.Second) / p.cfg.BytesPerSecond))
			}
			if _, err := dst.Write(c.b); err != nil {
				failed = true
				dst.Close()
				src.Close()
			}
		}
		free <- c.b[:cap(c.b)]
	}
	if tc, ok := dst.(*net.TCPConn); ok && !failed {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
}

func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}
