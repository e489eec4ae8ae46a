//go:build !unix

package proxy

import (
	"errors"
	"net"
)

// peekSocket: no MSG_PEEK here; the caller reads as usual.
func peekSocket(net.Conn, []byte) (int, bool) { return 0, false }

// waitSocket: no MSG_PEEK here; nothing is watched.
func waitSocket(net.Conn) error { return errors.ErrUnsupported }
