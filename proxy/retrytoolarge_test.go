package proxy

import (
	"testing"
	"time"
)

// The broker's MESSAGE_TOO_LARGE becomes a retry once per record: a request
// checked against a limit cached at least limitRecheck before it is
// retried, and so are requests in flight with it; the retry, checked
// against the limit read again, is not, however long its producer waited
// before sending it (franz-go: a metadata refresh, up to 5 s; a loop of
// retries failed a proxy attack test when the guard was a one-second
// window); a limit lowered again later is retried again.
func TestRetryTooLargeOncePerRecheck(t *testing.T) {
	ic := &interception{retried: map[string]time.Time{}}
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ms := time.Millisecond
	steps := []struct {
		what               string
		topic              string
		readAt, start, now time.Duration
		cached             bool
		want               bool
	}{
		{"checked against a limit read 10 s before", "a", -10 * time.Second, 0, 10 * ms, true, true},
		{"in flight with it (the entry forgotten)", "a", 0, 5 * ms, 12 * ms, false, true},
		{"in flight with it (the entry read again)", "a", 100 * ms, 5 * ms, 120 * ms, true, true},
		{"the retry, 5 s later, checked against the limit read again", "a", 5001 * ms, 5000 * ms, 5010 * ms, true, false},
		{"the retry, its lookup failed", "a", 0, 5000 * ms, 5010 * ms, false, false},
		{"another topic, a limit read just before", "b", 200 * ms, 500 * ms, 510 * ms, true, false},
		{"the limit lowered again a minute later", "a", 5001 * ms, 70 * time.Second, 70*time.Second + 10*ms, true, true},
	}
	for i, s := range steps {
		if got := ic.retryTooLarge(s.topic, at(s.start), at(s.readAt), s.cached, at(s.now)); got != s.want {
			t.Fatalf("step %d, %s: retry %v, want %v", i, s.what, got, s.want)
		}
	}
	if _, ok := ic.retried["b"]; ok || len(ic.retried) != 1 {
		t.Fatalf("remembered %v, want a alone", ic.retried)
	}
	// Answers older than retriedKeep are dropped when one is added.
	ic.retryTooLarge("c", at(200*time.Second), at(190*time.Second), true, at(200*time.Second))
	if _, ok := ic.retried["a"]; ok || len(ic.retried) != 1 {
		t.Fatalf("remembered %v, want c alone", ic.retried)
	}
}
