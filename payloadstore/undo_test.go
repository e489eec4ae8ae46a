package payloadstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferrykit/ferry/payloadstore"
)

// Undo outlives its caller's context; with an UndoBound it ends when the
// bound stops, through context.WithoutCancel and a store's own timeout,
// and only failures after the stop count as left.
func TestUndoBound(t *testing.T) {
	caller, cancelCaller := context.WithCancel(context.Background())
	cancelCaller()
	if err := payloadstore.Undo(caller).Err(); err != nil {
		t.Fatalf("Undo without a bound: %v, want a context that outlives its caller's", err)
	}

	b := payloadstore.NewUndoBound()
	conn, cancelConn := context.WithCancel(b.With(context.Background()))
	cancelConn() // the client went away
	undo := payloadstore.Undo(context.WithoutCancel(conn))
	if err := undo.Err(); err != nil {
		t.Fatalf("Undo under a bound not stopped: %v", err)
	}
	payloadstore.UndoFailed(undo)                              // a store failure before the stop
	timed, cancelTimed := context.WithTimeout(undo, time.Hour) // a store's own timeout
	defer cancelTimed()
	b.Stop()
	<-timed.Done()
	if !errors.Is(timed.Err(), context.Canceled) || !errors.Is(undo.Err(), context.Canceled) {
		t.Fatalf("after Stop: %v, %v; want context.Canceled", timed.Err(), undo.Err())
	}
	payloadstore.UndoFailed(timed)
	if n := b.Left(); n != 1 {
		t.Fatalf("Left %d, want 1 (the failure after the stop)", n)
	}
}
