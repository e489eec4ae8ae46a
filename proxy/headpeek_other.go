//go:build !unix

package proxy

import "net"

// peekSocket: no MSG_PEEK here; the caller reads as usual.
func peekSocket(net.Conn, []byte) (int, bool) { return 0, false }
