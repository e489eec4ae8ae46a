package proxy

import (
	"bufio"
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"
)

// drainRaceConn runs hook at the first zero read deadline set on it, before
// setting it: Shutdown's drain landing just there.
type drainRaceConn struct {
	net.Conn
	hook func()
}

func (d *drainRaceConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() && d.hook != nil {
		h := d.hook
		d.hook = nil
		h()
	}
	return d.Conn.SetReadDeadline(t)
}

// Shutdown's drain (draining set, then a read deadline in the past) can
// come while watchClient's stop clears the deadline it set to end its
// peek: between stop's look at draining and its clear. The clear then
// wiped the drain's deadline, and the reader went on reading the client's
// requests (a producer sends more) until shutdown.timeout.ms cut it. A
// drain must stop the reader whatever the interleaving.
func TestWatchClientStopKeepsDrainDeadline(t *testing.T) {
	s, err := New(Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	client, peer := net.Pipe()
	defer peer.Close()
	rc := &drainRaceConn{Conn: client}
	c := newConn(s, rc, 0)
	defer c.close()
	c.cr = bufio.NewReaderSize(activityReader{c}, readerSize)
	_, stop := c.watchClient(c.ctx)
	rc.hook = c.drain // Shutdown drains just as stop clears its deadline
	stop()
	if !c.draining.Load() {
		t.Fatal("the drain did not run")
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.cr.Peek(1)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("reader after the drain: %v, want the drain's deadline", err)
		}
	case <-time.After(3 * time.Second):
		c.close()
		<-done
		t.Fatal("the reader still waits on the client after Shutdown's drain: watchClient's stop cleared the drain's deadline")
	}
}
