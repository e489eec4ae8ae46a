package proxy

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// Many clients connect while the upstream broker is down: the connections
// held are bounded by max.connections (the rest refused at once), each
// costs a bounded number of goroutines, and the dial attempts follow the
// backoff (not a busy loop); once upstream.connect.timeout.ms has passed
// every held connection is reset and its goroutines are gone.
func TestUpstreamDownManyClientsBounded(t *testing.T) {
	const maxConns, clients = 40, 120
	const connectTimeout = 10 * time.Second
	before := runtime.NumGoroutine()
	s := startHeldProxy(t, Config{Upstream: []string{deadAddr(t)}, MaxConnections: maxConns,
		ConnectTimeout: connectTimeout, ReconnectBackoff: 50 * time.Millisecond, ReconnectBackoffMax: 400 * time.Millisecond})
	start := time.Now()
	var conns []net.Conn
	for range clients {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, _ = c.Write(apiVersionsV0)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// The precondition: max.connections held (a busy machine may take a
	// while to accept them all; the connect timeout is long enough that
	// none is reset before).
	for connCount(s) < maxConns && time.Since(start) < connectTimeout/2 {
		time.Sleep(20 * time.Millisecond)
	}
	held, g := connCount(s), runtime.NumGoroutine()
	if held != maxConns {
		t.Fatalf("%d connections held after %v, want max.connections %d", held, time.Since(start).Round(time.Millisecond), maxConns)
	}
	if perConn := float64(g-before) / float64(held); perConn > 4 {
		t.Fatalf("%d goroutines for %d held connections", g-before, held)
	}
	// Over 1.5 s with backoff 50 ms doubling to 400 ms: a few attempts per
	// connection; a busy loop would make thousands.
	d0 := s.failedDials()
	time.Sleep(1500 * time.Millisecond)
	if dials := s.failedDials() - d0; dials > maxConns*12 {
		t.Fatalf("%v failed dials for %d held connections in 1.5 s", dials, held)
	}
	deadline := start.Add(connectTimeout + 30*time.Second)
	for connCount(s) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := connCount(s); n != 0 {
		t.Fatalf("%d connections still held 30 s after upstream.connect.timeout.ms", n)
	}
	t.Logf("held %d of %d clients, %d goroutines meanwhile (%d before), reset after %v", held, clients, g, before,
		time.Since(start).Round(time.Millisecond))
}
