//go:build !linux

package proxy

import "net"

// peerReset: the socket's state is not read here; an ECONNRESET of a
// splice counts as the client's only once the reader has seen it end.
func peerReset(net.Conn) bool { return false }
