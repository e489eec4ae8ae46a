package proxy

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferrykit/ferry/interceptor"
)

// The reader can end (its deferred close of pending and kickWriter) after
// the writer found pending empty (nextRequest's tryPending) and before it
// set parked in waitUpstream: the kick then finds the writer not parked and
// sets no deadline, and len(pending) of a closed, empty channel is 0 too.
// waitUpstream must still return at once, not wait on the idle upstream
// connection until the broker closes it (connections.max.idle.ms, 10
// minutes by default): the client's connection, its goroutines and its
// broker connection would be held that long after the client closed, and
// Shutdown would wait for it until shutdown.timeout.ms. A client that
// half-closes right after its last response meets this window when the
// writer's thread is preempted there.
func TestWaitUpstreamAfterReaderEnded(t *testing.T) {
	s, err := New(Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	client, peer := net.Pipe()
	defer peer.Close()
	up, broker := net.Pipe() // an idle broker: sends nothing
	defer broker.Close()
	c := newConn(s, client, 0)
	defer c.close()
	c.upstream, c.ur = up, bufio.NewReaderSize(up, readerSize)
	close(c.upReady)

	// The writer has found pending empty; the reader ends now, before the
	// writer parks.
	c.readerEnded()

	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := c.waitUpstream(); err != nil {
			t.Errorf("waitUpstream: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		c.close() // ends the Peek
		<-done
		t.Fatal("waitUpstream waited on the idle upstream after the reader had ended (pending closed)")
	}
	if f, ok, queued := tryPending(c.pending); !queued || ok || f != nil {
		t.Fatalf("pending: queued %v ok %v, want closed", queued, ok)
	}
}

// A connection closed by the other goroutine (the writer's failed write to a
// client that reset, the idle reaper, Shutdown's deadline) cancels c.ctx, so
// the reader's next charge to the memory budget fails at once, whatever the
// room: that is the close's consequence, not a full budget. Seen with raw
// clients that reset with Produce requests pipelined through validate-json:
// ferry_proxy_errors_total{kind="memory"} counted, and "no room in
// proxy.memory.max.bytes" logged at warn, with the budget all but empty.
// The same for the other failures of a connection already closed (a reader
// in auth.await woken by the close: "unauthenticated").
func TestFailOnClosedConnectionNotCounted(t *testing.T) {
	s, err := New(Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	client, peer := net.Pipe()
	defer peer.Close()
	c := newConn(s, client, 0)
	frame := produceV9Frame(1, "p", 1, `{"a":1}`)
	h, err := ParseRequestHeader(frame[4:])
	if err != nil {
		t.Fatal(err)
	}
	c.close() // the writer's failed write to a client that reset
	if _, ok := c.chargeShape(h, frame); ok {
		t.Fatal("chargeShape on a closed connection: ok")
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("memory")); n != 0 {
		t.Fatalf(`errors_total{kind="memory"} = %v for a connection already closed, want 0`, n)
	}
	if s.mem.InUse() != 0 {
		t.Fatalf("memory in use %d", s.mem.InUse())
	}
}

// As above for the reader's wait for SASL (auth.await), which a close ends
// with false: a raw client that reset with Produce requests pipelined
// through validate-json, on a broker without SASL, was counted
// kind="unauthenticated" and logged "Produce request before SASL
// authentication completed".
func TestFailOnClosedConnectionNotUnauthenticated(t *testing.T) {
	s, err := New(Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Interceptors: []interceptor.Spec{{Name: "validate-json", Config: map[string]string{"topic.pattern": "t"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	client, peer := net.Pipe()
	defer peer.Close()
	c := newConn(s, client, 0)
	g := s.acquireChain()
	if !g.hasProduce() {
		t.Fatal("no produce interceptor in force")
	}
	c.close()
	if ok, _ := c.handleWhole(produceV9Frame(1, "p", 1, `{"a":1}`), g, nil); ok {
		t.Fatal("handleWhole on a closed connection: ok")
	}
	g.release()
	for _, kind := range []string{"unauthenticated", "memory", "malformed"} {
		if n := testutil.ToFloat64(s.m.errors.WithLabelValues(kind)); n != 0 {
			t.Errorf(`errors_total{kind=%q} = %v for a connection already closed, want 0`, kind, n)
		}
	}
}
