package proxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"time"
)

// errUnknownNode: the proxy knows no endpoint for a broker listener's node
// id; dialling again does not help.
var errUnknownNode = errors.New("no known endpoint for broker")

// errClientLeft: the client closed its side while its first request waited
// for the upstream broker.
var errClientLeft = errors.New("the client closed the connection while its request waited for the upstream broker")

// dialHeld dials c's upstream broker. While the broker cannot be reached (a
// restart, a failover) it holds the client's request and dials again, with
// backoff from upstream.reconnect.backoff.ms doubling to
// upstream.reconnect.backoff.max.ms (±20% jitter), until
// upstream.connect.timeout.ms has passed since the first attempt, the
// client closes its side (errClientLeft), or the connection closes
// (Shutdown). Each attempt is bounded by dial.timeout.ms and by what is
// left of the total.
//
// Why: a proxy that accepted the client's connection and then closed it
// during ApiVersions looks to clients like a broker that wants TLS or SASL
// (franz-go's ErrFirstReadEOF, "is TLS missing?", is not retriable, and it
// fails the records it had buffered). Held, the client sees a slow answer;
// one that times out first closes and reconnects, as from a slow broker.
func (c *conn) dialHeld() (net.Conn, error) {
	cfg := &c.s.cfg
	start := time.Now()
	backoff := cfg.ReconnectBackoff
	for attempt := 1; ; attempt++ {
		ctx, cancel := c.ctx, context.CancelFunc(func() {})
		if cfg.ConnectTimeout > 0 {
			ctx, cancel = context.WithDeadline(c.ctx, start.Add(cfg.ConnectTimeout))
		}
		up, err := c.s.dialUpstream(ctx, c.nodeID)
		cancel()
		if err == nil {
			if attempt > 1 {
				c.log.Info("reached the upstream broker; the held request goes on", "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return up, nil
		}
		if cfg.ConnectTimeout < 0 || errors.Is(err, errUnknownNode) || c.closed() {
			return nil, err
		}
		wait := time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64()))
		if left := cfg.ConnectTimeout - time.Since(start); left <= 0 {
			return nil, fmt.Errorf("%w (%d attempts in %s; upstream.connect.timeout.ms %d)", err, attempt,
				time.Since(start).Round(time.Millisecond), cfg.ConnectTimeout.Milliseconds())
		} else if wait > left {
			wait = left
		}
		if attempt == 1 {
			c.log.Info("cannot reach the upstream broker; holding the client's request and dialling again",
				"err", err, "upstream.connect.timeout.ms", cfg.ConnectTimeout.Milliseconds())
		}
		if !c.waitClient(wait) {
			if c.closed() || c.draining.Load() {
				return nil, net.ErrClosed
			}
			return nil, errClientLeft
		}
		backoff = min(2*backoff, cfg.ReconnectBackoffMax)
	}
}

// waitClient waits d while watching the client's side without consuming
// what it sends: false when the client closed it (or it failed), or the
// connection is closing or draining. The reader goroutine calls it (it
// alone reads the client).
func (c *conn) waitClient(d time.Duration) bool {
	if c.cr.Buffered() > 0 {
		// The client pipelined more: nothing to watch, only wait.
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return !c.draining.Load()
		case <-c.done:
			return false
		}
	}
	_ = c.client.SetReadDeadline(time.Now().Add(d))
	_, err := c.cr.Peek(1)
	// Reset before looking at draining: a drain that comes later sets its
	// own deadline after this one.
	_ = c.client.SetReadDeadline(time.Time{})
	if c.draining.Load() || c.closed() {
		return false
	}
	return err == nil || errors.Is(err, os.ErrDeadlineExceeded)
}

// abortive sets whether closing the client's connection resets it (TCP
// RST: SO_LINGER 0) rather than closing it (FIN). A connection starts
// abortive and stops being so once the client has had an answer to a
// request other than ApiVersions or SASL (answered), or has closed its
// side (readError: what it is owed goes out before a plain close).
//
// Why: franz-go takes a plain close before that first answer for a broker
// that wants TLS or SASL (ErrFirstReadEOF: "is TLS missing?", "is SASL
// missing?") and does not retry it: it fails the records it had buffered.
// A reset is a network error that franz-go, the Java client and
// librdkafka all retry. Set on the socket itself, it holds even when the
// proxy process is killed (the kernel resets the sockets it closes). Once
// the client has been served, a plain close is kept (a reset would also
// drop response bytes the client has not acknowledged yet).
func (c *conn) abortive(on bool) {
	if tc := clientTCP(c.client); tc != nil {
		sec := -1 // the system's default: a plain close
		if on {
			sec = 0
		}
		_ = tc.SetLinger(sec)
	}
}

// resetUnanswered closes the client's connection with a reset when it is
// still abortive (see abortive), before the close that follows: on TLS the
// reset also comes without a close_notify alert, which a client would read
// as a clean end.
func (c *conn) resetUnanswered() {
	if c.served.Load() {
		return
	}
	if tc := clientTCP(c.client); tc != nil {
		_ = tc.SetLinger(0)
		_ = tc.Close()
	}
}

// clientTCP is the TCP connection under nc (a *tls.Conn's too), nil when
// there is none (a test's net.Pipe).
func clientTCP(nc net.Conn) *net.TCPConn {
	if tc, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = tc.NetConn()
	}
	tc, _ := nc.(*net.TCPConn)
	return tc
}
