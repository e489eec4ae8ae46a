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
	before := runtime.NumGoroutine()
	s := startHeldProxy(t, Config{Upstream: []string{deadAddr(t)}, MaxConnections: maxConns,
		ConnectTimeout: 2 * time.Second, ReconnectBackoff: 50 * time.Millisecond, ReconnectBackoffMax: 400 * time.Millisecond})
	var conns []net.Conn
	for range clients {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, _ = c.Write(apiVersionsV0)
		time.Sleep(2 * time.Millisecond) // accepted in order
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	time.Sleep(time.Second)
	held, g := connCount(s), runtime.NumGoroutine()
	if held > maxConns {
		t.Fatalf("%d connections held, max.connections %d", held, maxConns)
	}
	if perConn := float64(g-before) / float64(max(held, 1)); perConn > 4 {
		t.Fatalf("%d goroutines for %d held connections", g-before, held)
	}
	time.Sleep(1500 * time.Millisecond)
	dials := s.failedDials()
	// 40 connections × 2 s with backoff 50 ms doubling to 400 ms: about 8
	// attempts each; a busy loop would make thousands.
	if dials > maxConns*12 {
		t.Fatalf("%v failed dials for %d held connections in 2 s", dials, held)
	}
	deadline := time.Now().Add(5 * time.Second)
	for connCount(s) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := connCount(s); n != 0 {
		t.Fatalf("%d connections still held after upstream.connect.timeout.ms", n)
	}
	t.Logf("held %d of %d clients, %d goroutines meanwhile (%d before), %v failed dials", held, clients, g, before, dials)
}
