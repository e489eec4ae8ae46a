package ctxio

import (
	"context"
	"io"
)

// Sizes of PipeCopy's buffers: PipeBuffers of PipeBufferSize bytes each,
// 1 MiB in all, held only while a copy runs. Measured with `ferry consume
// --out` of 1 GiB through the shaped S3 (docs/BENCHMARKS.md), 3 runs each,
// interleaved: 64 KiB and 256 KiB alike in wall time and system time,
// 256 KiB with less user time (fewer hand-offs between the goroutines);
// 1 MiB took 3-4 times the system time (2.9-4.3 s against 0.7-0.9 s), as
// it did for Copy.
const (
	PipeBufferSize = 256 << 10
	PipeBuffers    = 4
)

// PipeCopy copies src to dst until EOF, like Copy (ctx checked before every
// read; the bytes that come with a read error written before the error is
// returned), but writes on a second goroutine while the next pieces are
// read: what src does per byte (a download's copy out of its ranges, a
// SHA-256 check) overlaps what dst does (a file's write(2), which costs
// about as much again). It holds at most PipeBuffers buffers of
// PipeBufferSize bytes, made as they are first needed. It returns once the
// writer is done with dst; the count is of the bytes dst took. A write
// error stops the reads (at most PipeBuffers reads later) and is returned
// in preference to a read error, as the one that came first.
//
// Copy stays the better choice when src and dst are both cheap or the two
// cores are already busy: the buffers move between the cores' caches.
func PipeCopy(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	free := make(chan []byte, PipeBuffers)
	for range PipeBuffers {
		free <- nil
	}
	full := make(chan []byte, PipeBuffers)
	failed := make(chan struct{}) // closed by the writer on its error
	done := make(chan struct{})
	var (
		written int64
		werr    error
	)
	go func() {
		defer close(done)
		for b := range full {
			if werr == nil {
				nw, err := dst.Write(b)
				written += int64(nw)
				if err == nil && nw < len(b) {
					err = io.ErrShortWrite
				}
				if err != nil {
					werr = err
					close(failed)
				}
			}
			free <- b
		}
	}()
	var rerr error
	for rerr == nil {
		if err := ctx.Err(); err != nil {
			rerr = err
			break
		}
		var b []byte
		select {
		case b = <-free:
		case <-failed:
		}
		if b == nil {
			select {
			case <-failed:
			default:
				b = make([]byte, PipeBufferSize)
			}
		}
		if b == nil {
			break // the writer failed
		}
		var nr int
		nr, rerr = src.Read(b[:cap(b)])
		if nr > 0 {
			full <- b[:nr]
		} else {
			free <- b
		}
	}
	close(full)
	<-done
	switch {
	case werr != nil:
		return written, werr
	case rerr == io.EOF:
		return written, nil
	}
	return written, rerr
}
