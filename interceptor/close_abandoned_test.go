package interceptor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A call abandoned at the chain's timeout goes on in its goroutine (and
// may still use its payload store to undo what it did). Close while it
// runs (a reload retiring the chain once the timed-out request is
// answered) must not close the instances under it: they are closed when
// it ends, and Close itself does not wait for it.
func TestCloseWaitsForAbandonedCall(t *testing.T) {
	var closed, usedAfterClose atomic.Bool
	release := make(chan struct{})
	finished := make(chan struct{})
	in := Instance{Produce: icpt(t, "slow", "slow", func(context.Context, *Record) error {
		<-release // ignores ctx: a store call that outlives the budget
		if closed.Load() {
			usedAfterClose.Store(true)
		}
		close(finished)
		return nil
	}), Close: func() error { closed.Store(true); return nil }}
	ch := NewChain([]Instance{in}, Options{Timeout: 50 * time.Millisecond})
	ch.instances = []Instance{in}
	req := buildRequest(t, map[string][]byte{"slow": plainBatch(t, 0, -1, "a")})
	out := ch.InterceptProduce(context.Background(), req, nil)
	if len(out.Answered) != 1 {
		t.Fatalf("outcome %+v: want the slow partition answered (timed out)", out)
	}
	start := time.Now()
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close waited %s for the abandoned call", d)
	}
	if closed.Load() {
		t.Fatal("Close closed the instances while an abandoned call still runs")
	}
	close(release)
	<-finished
	deadline := time.Now().Add(5 * time.Second)
	for !closed.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if usedAfterClose.Load() {
		t.Fatal("the abandoned call ran on closed instances")
	}
	if !closed.Load() {
		t.Fatal("the instances were not closed once the abandoned call ended")
	}
}
