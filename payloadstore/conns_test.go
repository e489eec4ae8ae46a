package payloadstore

import (
	"context"
	"errors"
	"net"
	"testing"
)

// A store's Close closes the connections its client dialled, and the set
// refuses to dial after it.
func TestConnSetClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	var s connSet
	dial := s.dialer(nil)
	a, err := dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b.Close() // closed by the client: no longer held
	s.mu.Lock()
	held := len(s.conns)
	s.mu.Unlock()
	if held != 1 {
		t.Fatalf("%d connections held, want 1", held)
	}
	s.close()
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on a connection of a closed set: %v, want net.ErrClosed", err)
	}
	if _, err := dial(context.Background(), "tcp", ln.Addr().String()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("dial after close: %v, want net.ErrClosed", err)
	}
}
