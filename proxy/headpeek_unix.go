//go:build unix

package proxy

import (
	"net"
	"syscall"
)

// peekSocket copies up to len(p) bytes waiting in conn's socket into p
// without consuming them (recv with MSG_PEEK), waiting until some arrive.
// ok is false when conn is not a plain TCP connection, the peek failed, or
// the peer closed: the caller then reads as usual and meets the same end.
func peekSocket(conn net.Conn, p []byte) (n int, ok bool) {
	tc, isTCP := conn.(*net.TCPConn)
	if !isTCP {
		return 0, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, perr = syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK)
		return perr != syscall.EAGAIN // false: wait until the socket is readable
	})
	return n, err == nil && perr == nil && n > 0
}
