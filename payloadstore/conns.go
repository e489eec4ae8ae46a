package payloadstore

import (
	"context"
	"net"
	"sync"
)

// connSet holds the network connections a store's HTTP client dialled, so
// that Close can close them: the client keeps idle connections for ranged
// downloads (up to 4 × download.concurrency per host, kept for 90 s), and a
// store replaced by a proxy reload must not leave them, and the goroutines
// that serve them, behind.
type connSet struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// dialer wraps dial so that every connection it makes is held in s until
// it is closed. After s.close, new dials fail with net.ErrClosed.
func (s *connSet) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, set: s}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			c.Close()
			return nil, net.ErrClosed
		}
		if s.conns == nil {
			s.conns = map[*trackedConn]struct{}{}
		}
		s.conns[tc] = struct{}{}
		return tc, nil
	}
}

// close closes every connection still open.
func (s *connSet) close() {
	s.mu.Lock()
	conns := s.conns
	s.conns, s.closed = nil, true
	s.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	set  *connSet
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}
