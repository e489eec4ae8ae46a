package proxy

import (
	"testing"
	"time"
)

// The broker's MESSAGE_TOO_LARGE becomes a retry at most once per record:
// the first refusal for a topic is retried, and so are requests in flight
// with it (checked against the same stale limit); a request read after it
// was checked against the limit read again, so its refusal goes through
// for limitRecheck; after that a refusal is retried again (the limit may
// have been lowered once more).
func TestRetryTooLargeOncePerRecheck(t *testing.T) {
	ic := &interception{retried: map[string]time.Time{}}
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	steps := []struct {
		topic      string
		start, now time.Duration
		want       bool
	}{
		{"a", 0, 10 * time.Millisecond, true},                                      // the first refusal
		{"a", 5 * time.Millisecond, 12 * time.Millisecond, true},                   // read before it: same stale limit
		{"a", 200 * time.Millisecond, 210 * time.Millisecond, false},               // the retry, refused again: goes through
		{"b", 200 * time.Millisecond, 210 * time.Millisecond, true},                // another topic is its own
		{"a", 900 * time.Millisecond, 1000 * time.Millisecond, false},              // still within limitRecheck
		{"a", 1100 * time.Millisecond, limitRecheck + 20*time.Millisecond, true},   // past it: retried again
		{"a", 1200 * time.Millisecond, limitRecheck + 300*time.Millisecond, false}, // and that retry's refusal goes through
		{"a", 1010 * time.Millisecond, limitRecheck + 310*time.Millisecond, true},  // read before that retry's answer
	}
	for i, s := range steps {
		if got := ic.retryTooLarge(s.topic, at(s.start), at(s.now)); got != s.want {
			t.Fatalf("step %d (%s read at +%v, answered at +%v): retry %v, want %v", i, s.topic, s.start, s.now, got, s.want)
		}
	}
	// Answers older than limitRecheck are dropped when one is added.
	ic.retryTooLarge("c", at(10*time.Second), at(10*time.Second))
	if len(ic.retried) != 1 {
		t.Fatalf("%d topics remembered, want only c: %v", len(ic.retried), ic.retried)
	}
}
