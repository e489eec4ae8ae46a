package payloadstore

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// writebackChunk is how many bytes startWriteback lets accumulate before it
// asks the kernel to start writing them.
const writebackChunk = 8 << 20

// startWriteback returns a writer of f that, every writebackChunk bytes,
// starts the disk writing what was written (sync_file_range(2) with
// SYNC_FILE_RANGE_WRITE: asynchronous, and no promise of durability; the
// fsync that commits the object still makes it durable). Without it the
// kernel holds a large payload in dirty pages until the fsync, which then
// waits for all of it; with it the disk works while the payload is still
// being hashed and copied. A file system that does not support it is left
// alone after the first error.
func startWriteback(f *os.File) io.Writer {
	rc, err := f.SyscallConn()
	if err != nil {
		return f
	}
	return &writeback{f: f, rc: rc}
}

type writeback struct {
	f         *os.File
	rc        interface{ Control(func(fd uintptr)) error }
	off, from int64
	disabled  bool // sync_file_range failed once: no more tries
}

func (w *writeback) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if err == nil && !w.disabled && w.off-w.from >= writebackChunk {
		var serr error
		if cerr := w.rc.Control(func(fd uintptr) {
			serr = unix.SyncFileRange(int(fd), w.from, w.off-w.from, unix.SYNC_FILE_RANGE_WRITE)
		}); cerr != nil || serr != nil {
			w.disabled = true
		}
		w.from = w.off
	}
	return n, err
}
