package payloadstore

import (
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

// File-system errors another attempt cannot fix are not retried (the
// store would otherwise spend large.message.payload.store.timeout.ms on
// them): ENAMETOOLONG and its kin.
func TestFatalFileSystemErrors(t *testing.T) {
	for _, err := range []error{syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EINVAL, syscall.EROFS, syscall.ENOTDIR,
		syscall.EISDIR, syscall.EFBIG, syscall.EXDEV, fs.ErrPermission, &fs.PathError{Op: "open", Path: "x", Err: syscall.ENAMETOOLONG}} {
		if retryableFSError(fmt.Errorf("wrapped: %w", err)) {
			t.Errorf("%v is retried", err)
		}
	}
	for _, err := range []error{syscall.EIO, syscall.ENOSPC, syscall.EAGAIN} {
		if !retryableFSError(err) {
			t.Errorf("%v is not retried", err)
		}
	}
}
