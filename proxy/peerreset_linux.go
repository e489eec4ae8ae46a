//go:build linux

package proxy

import (
	"net"

	"golang.org/x/sys/unix"
)

// peerReset reports whether conn's TCP socket was ended by its peer: its
// state is CLOSE, as a received reset leaves it (a reset of the broker's
// connection leaves the client's ESTABLISHED). It tells whose reset an
// ECONNRESET of a splice was (writeFailed): the error of a splice from the
// broker to the client does not say which side failed.
func peerReset(conn net.Conn) bool {
	if nc, ok := conn.(interface{ NetConn() net.Conn }); ok { // TLS
		conn = nc.NetConn()
	}
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	if err := rc.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		closed = err == nil && info.State == unix.BPF_TCP_CLOSE
	}); err != nil {
		return false
	}
	return closed
}
