package ctxio

import (
	"bytes"
	"context"
	"io"
	"sync"
)

// BufferSize is the size of the buffer Copy moves bytes in. Measured on the
// 2-core AMD EPYC of docs/BENCHMARKS.md (a 1 GiB file from the page cache
// read, SHA-256 hashed and written to a new file, no fsync, sync(1) between
// runs, sizes interleaved, 3 runs each, load average 6-8): 64 KiB took
// 1.50-1.73 s (0.67-0.89 s of system time), 32 KiB 1.79-1.81 s, 256 KiB
// 2.01-2.53 s, 1 MiB 2.94-3.06 s (1.75-2.07 s of system time: the larger
// the buffer, the less of it is still in the core's cache between the
// read, the hash and the write).
const BufferSize = 64 << 10

var buffers = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}

// Copy copies src to dst until EOF, like io.Copy, and stops with ctx's
// error once ctx ends (checked before every read). It reads and writes
// BufferSize bytes at a time, through a pooled buffer, ignoring dst's
// ReadFrom and src's WriteTo. The bytes that come with a read
// error are written before the error is returned, as io.Copy does.
//
// A *bytes.Reader src (a payload already in memory) is written in one call,
// with no buffer.
//
// (Reading and hashing on one goroutine while another writes was measured
// too: on 2 shared cores it took as long and more CPU, the buffers moving
// between the cores' caches.)
func Copy(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if br, ok := src.(*bytes.Reader); ok {
		return br.WriteTo(dst)
	}
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	buf := *bp
	var written int64
	for {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			written += int64(nw)
			if werr != nil {
				return written, werr
			}
			if nw < nr {
				return written, io.ErrShortWrite
			}
		}
		if rerr == io.EOF {
			return written, nil
		}
		if rerr != nil {
			return written, rerr
		}
	}
}
