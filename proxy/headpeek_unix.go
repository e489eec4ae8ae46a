//go:build unix

package proxy

import (
	"crypto/tls"
	"errors"
	"io"
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

// waitSocket waits until conn's socket has bytes to read or its peer has
// ended the connection, taking none of them (recv with MSG_PEEK): nil when
// bytes wait, io.EOF when the peer closed, else the error (the read
// deadline's os.ErrDeadlineExceeded, a reset). A TLS connection is looked
// at below TLS: a peer that closes with a close_notify alert is bytes
// waiting, one that closes without (a process killed, a reset) is seen.
// errors.ErrUnsupported: conn is not over a plain TCP connection.
func waitSocket(conn net.Conn) error {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	tc, isTCP := conn.(*net.TCPConn)
	if !isTCP {
		return errors.ErrUnsupported
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var n int
	var perr error
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, perr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		return perr != syscall.EAGAIN // false: wait until the socket is readable
	})
	switch {
	case err != nil:
		return err
	case perr != nil:
		return perr
	case n == 0:
		return io.EOF
	}
	return nil
}
