package proxy

import (
	"sync/atomic"
	"time"
)

// Connection limits (docs/SECURITY.md): max.connections and
// max.connections.per.ip are checked at accept (server.go); this file holds
// connections.first.request.timeout.ms and the rate limit of the warnings
// that refusals log.

// logLimiter lets one warning line through every period and counts the
// events it held back, so that a flood of refusals (one address opening
// thousands of sockets) costs a line every period, not one per connection.
type logLimiter struct {
	last    atomic.Int64 // unix ns of the last line let through
	skipped atomic.Int64 // events since then
}

// allow counts one event and reports whether a line may be logged now, and
// how many events (this one included) it stands for.
func (l *logLimiter) allow(every time.Duration) (events int64, ok bool) {
	l.skipped.Add(1)
	now := time.Now().UnixNano()
	last := l.last.Load()
	if now-last < int64(every) || !l.last.CompareAndSwap(last, now) {
		return 0, false
	}
	return l.skipped.Swap(0), true
}

// refusalLogEvery rate-limits the warnings about refused connections
// (limits reached, first requests not sent in time, unknown broker ids).
const refusalLogEvery = 10 * time.Second

// startFirstRequestTimer closes c unless firstRequestDone is called within
// connections.first.request.timeout.ms.
func (c *conn) startFirstRequestTimer() {
	d := c.s.cfg.FirstRequestTimeout
	if d <= 0 {
		c.firstDone.Store(true)
		return
	}
	c.firstTimer = time.AfterFunc(d, c.firstRequestExpired)
}

// firstRequestDone marks c as a client that has sent a whole request (or
// whose request waits for the proxy): the deadline no longer applies.
func (c *conn) firstRequestDone() {
	if c.firstDone.CompareAndSwap(false, true) && c.firstTimer != nil {
		c.firstTimer.Stop()
	}
}

// firstRequestExpired closes a connection that has sent no whole request
// within connections.first.request.timeout.ms: counted, and logged at most
// every refusalLogEvery for all connections.
func (c *conn) firstRequestExpired() {
	if !c.firstDone.CompareAndSwap(false, true) || c.closed() {
		return
	}
	c.s.m.errors.WithLabelValues("first_request_timeout").Inc()
	if n, ok := c.s.firstTimeoutLog.allow(refusalLogEvery); ok {
		c.log.Warn("closing a connection that sent no whole request within connections.first.request.timeout.ms (logged at most every 10s)",
			"connections.first.request.timeout.ms", c.s.cfg.FirstRequestTimeout.Milliseconds(), "closed", n)
	}
	c.close()
}
