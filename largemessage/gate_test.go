package largemessage

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"
)

// gateLimits are limits under which a gate bounds the bytes in flight:
// franz-go's batch cap (3 x) is above what the topic accepts.
func gateLimits(maxMessage int64) Limits {
	return DeriveLimits(0, maxMessage, 3*maxMessage)
}

// admitted reports whether take(n) returns within a short wait.
func admitted(t *testing.T, g *gate, n int64) (chan error, func() bool) {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- g.take(context.Background(), n) }()
	return ch, func() bool {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}
}

// waiters waits until g has n waiters.
func waiters(t *testing.T, g *gate, n int) {
	t.Helper()
	for range 500 {
		g.mu.Lock()
		k := len(g.waiters)
		g.mu.Unlock()
		if k == n {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("never %d waiters", n)
}

// The CI failure this guards against: records sent under a topic's old
// max.message.bytes were still in flight when a record refused as too large
// was retried under the lowered limit; the gate of the new limit did not
// count them, franz-go batched them with the retried record, and the
// broker refused it a second time.
func TestGateCountsRecordsSentUnderOldLimits(t *testing.T) {
	g := &gate{capacity: 1 << 62}
	old, lowered := gateLimits(1_000_000), gateLimits(500_000)
	g.setLimits("t", old, Codec{Type: "none"}, 0)
	for range 3 {
		if err := g.take(context.Background(), 300_000); err != nil {
			t.Fatal(err)
		}
	}
	// The retry finds the limit lowered (generation 1).
	g.setLimits("t", lowered, Codec{Type: "none"}, 1)
	// A caller that read the old limits before the retry does not raise
	// the capacity again.
	g.setLimits("t", old, Codec{Type: "none"}, 0)
	if want := lowered.batchCapacity(Codec{Type: "none"}); g.capacity != want {
		t.Fatalf("capacity %d, want the lowered limit's %d", g.capacity, want)
	}
	_, done := admitted(t, g, 100_000)
	if done() {
		t.Fatal("admitted with 900,000 bytes of the old limit in flight and a capacity of about 500,000")
	}
	g.give(300_000)
	if done() {
		t.Fatal("admitted with 600,000 bytes in flight")
	}
	g.give(300_000)
	if !done() {
		t.Fatal("not admitted with 300,000 bytes in flight (300,000 + 100,000 fit)")
	}
	if g.inflight() != 400_000 {
		t.Fatalf("in flight %d, want 400000", g.inflight())
	}
}

// A record larger than the capacity goes alone; waiters are admitted in
// order; a waiter whose context ends leaves nothing counted.
func TestGateOrderAloneAndCancel(t *testing.T) {
	l := gateLimits(100_000)
	g := &gate{capacity: 1 << 62}
	g.setLimits("t", l, Codec{Type: "none"}, 0)
	if err := g.take(context.Background(), 60_000); err != nil {
		t.Fatal(err)
	}
	_, bigDone := admitted(t, g, 250_000) // larger than one batch
	waiters(t, g, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() { cancelled <- g.take(ctx, 10_000) }()
	waiters(t, g, 2)
	_, smallDone := admitted(t, g, 10_000)
	waiters(t, g, 3)
	if bigDone() || smallDone() {
		t.Fatal("admitted past the bound or out of order")
	}
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled take: %v", err)
	}
	g.give(60_000)
	if !bigDone() {
		t.Fatal("a record larger than the capacity is not admitted alone")
	}
	if smallDone() {
		t.Fatal("admitted beside a record that fills the batch")
	}
	g.give(250_000)
	if !smallDone() {
		t.Fatal("the last waiter is not admitted")
	}
	if g.inflight() != 10_000 || len(g.waiters) != 0 {
		t.Fatalf("in flight %d, %d waiters: the cancelled take left bytes or a waiter behind", g.inflight(), len(g.waiters))
	}
}

// Raising the limit (a later generation) admits waiters at once.
func TestGateRaisedLimitAdmits(t *testing.T) {
	low, high := gateLimits(100_000), gateLimits(400_000)
	g := &gate{capacity: 1 << 62}
	g.setLimits("t", low, Codec{Type: "none"}, 0)
	if err := g.take(context.Background(), 80_000); err != nil {
		t.Fatal(err)
	}
	_, done := admitted(t, g, 80_000)
	if done() {
		t.Fatal("admitted past the bound")
	}
	g.setLimits("t", high, Codec{Type: "none"}, 1)
	if !done() {
		t.Fatal("not admitted after the limit was raised")
	}
}

// Records admitted on the lock-free path of an unbounded gate are counted
// when the gate becomes bounded: a record sent under the old limits holds
// back one taken under the new ones.
func TestGateFastPathCountedWhenBounded(t *testing.T) {
	unbounded, bounded := DeriveLimits(0, 1_000_000, 500_000), gateLimits(100_000)
	g := &gate{capacity: math.MaxInt64}
	g.setLimits("t", unbounded, Codec{Type: "none"}, 0)
	for range 3 {
		if err := g.take(context.Background(), 90_000); err != nil {
			t.Fatal(err)
		}
	}
	if g.slow.Load() {
		t.Fatal("an unbounded gate without waiters is slow")
	}
	g.setLimits("t", bounded, Codec{Type: "none"}, 1)
	_, done := admitted(t, g, 50_000)
	if done() {
		t.Fatal("admitted beside 270000 bytes taken before the gate was bounded")
	}
	g.give(90_000)
	g.give(90_000)
	if done() {
		t.Fatal("admitted beside 90000 bytes in a batch of 100000")
	}
	g.give(90_000)
	if !done() {
		t.Fatal("not admitted once alone")
	}
	g.setLimits("t", unbounded, Codec{Type: "none"}, 2)
	g.give(50_000)
	if g.inflight() != 0 || g.slow.Load() {
		t.Fatalf("in flight %d, slow %v: want 0, false", g.inflight(), g.slow.Load())
	}
}

// Takes and gives on both paths while the limits switch between bounded and
// unbounded: no byte is lost or counted twice, and nobody is left waiting.
// (That bytes taken on the lock-free path count against a gate bounded
// later: TestGateFastPathCountedWhenBounded.)
func TestGateFastPathRace(t *testing.T) {
	unbounded, bounded := DeriveLimits(0, 1_000_000, 500_000), gateLimits(100_000)
	g := &gate{capacity: math.MaxInt64}
	stop := make(chan struct{})
	var flips sync.WaitGroup
	flips.Add(1)
	go func() {
		defer flips.Done()
		for gen := uint64(0); ; gen++ {
			select {
			case <-stop:
				g.setLimits("t", unbounded, Codec{Type: "none"}, gen)
				return
			default:
			}
			l := unbounded
			if gen%2 == 1 {
				l = bounded
			}
			g.setLimits("t", l, Codec{Type: "none"}, gen)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	var takers sync.WaitGroup
	for i := range 4 {
		takers.Add(1)
		go func() {
			defer takers.Done()
			for j := range 5000 {
				n := int64(1_000 + (i*7919+j*104729)%30_000)
				if err := g.take(context.Background(), n); err != nil {
					t.Error(err)
					return
				}
				g.give(n)
			}
		}()
	}
	done := make(chan struct{})
	go func() { takers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("takers stuck")
	}
	close(stop)
	flips.Wait()
	if g.inflight() != 0 || len(g.waiters) != 0 || g.slow.Load() {
		t.Fatalf("after the run: in flight %d, %d waiters, slow %v; want 0, 0, false", g.inflight(), len(g.waiters), g.slow.Load())
	}
}
