package faultproxy

import (
	"net"
	"sync"
)

// Silent is a TCP server that accepts connections and never reads from or
// answers them: a broker, KMS or object store that hangs, which a real one
// cannot be made to do on demand. It holds the connections until Close.
type Silent struct {
	ln       net.Listener
	accepted chan struct{}

	mu    sync.Mutex
	conns []net.Conn
}

// NewSilent starts a Silent server on a free port of 127.0.0.1.
func NewSilent() (*Silent, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Silent{ln: ln, accepted: make(chan struct{}, 100)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			select {
			case s.accepted <- struct{}{}:
			default:
			}
		}
	}()
	return s, nil
}

// Addr is the server's host:port.
func (s *Silent) Addr() string { return s.ln.Addr().String() }

// Accepted gets a value for each connection accepted (the first 100 not
// yet received are kept).
func (s *Silent) Accepted() <-chan struct{} { return s.accepted }

// Count is how many connections the server has accepted.
func (s *Silent) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops accepting and closes the connections held.
func (s *Silent) Close() {
	s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}
