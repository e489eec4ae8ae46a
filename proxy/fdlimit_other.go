//go:build !unix

package proxy

// fileDescriptorLimit: no RLIMIT_NOFILE on this platform (0: unknown).
func fileDescriptorLimit() uint64 { return 0 }
