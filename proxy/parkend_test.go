package proxy

import (
	"bufio"
	"log/slog"
	"net"
	"testing"
	"time"
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
