//go:build unix

package proxy

import "syscall"

// fileDescriptorLimit is the soft RLIMIT_NOFILE of the process; 0 when it
// cannot be read or is unlimited.
func fileDescriptorLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == ^uint64(0) {
		return 0
	}
	return uint64(r.Cur) //nolint:unconvert // int64 on some platforms
}
