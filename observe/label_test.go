package observe_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsTopicNotUTF8: a topic name is whatever bytes a client put in
// its produce request (the broker refuses it only later), and Prometheus
// panics on a label value that is not UTF-8. Counting such a topic must not
// panic: its label reads with U+FFFD in place of the bad bytes.
func TestMetricsTopicNotUTF8(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(t, reg, 10)
	bad := "t\xff\xfe"
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Rejected panicked on a topic that is not UTF-8: %v", r)
			}
		}()
		m.Rejected(bad, "produce", "MESSAGE_TOO_LARGE")
		m.Offloaded(bad, 10)
		m.Resolved(bad, 10)
	}()
	if got := counter(t, reg, "ferry_interceptor_rejections_total", "topic", "t\uFFFD", "reason", "MESSAGE_TOO_LARGE"); got != 1 {
		t.Fatalf("rejections of the sanitized topic = %v, want 1", got)
	}
	if got := counter(t, reg, "ferry_offloaded_bytes_total", "topic", "t\uFFFD"); got != 10 {
		t.Fatalf("offloaded bytes of the sanitized topic = %v, want 10", got)
	}
}
