package payloadstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"gocloud.dev/blob"
)

// Defaults of the download knobs (Options.DownloadPartBytes,
// Options.DownloadConcurrency): 8 MiB ranges, 8 in flight, so one download
// of a large object holds at most 64 MiB, whatever the object's size. AWS
// advises 8–16 MiB ranges and one request per 85–90 MB/s wanted.
const (
	DefaultDownloadPartBytes   = 8 << 20
	DefaultDownloadConcurrency = 8
	// minDownloadPartBytes keeps the requests per object sensible.
	minDownloadPartBytes = 256 << 10
)

// download opens key for reading. An object of at most one part
// (s.dlPart) is read with a single GET, resumed from the offset reached if it
// fails mid-stream (resumingReader). A larger one is read with concurrent
// ranged GETs delivered in order (rangedReader). With a concurrency of 1
// every object is one GET, as before ranged reads.
func (s *BlobStore) download(ctx context.Context, key, full string) (io.ReadCloser, error) {
	part, conc := s.dlPart, s.dlConcurrency
	if ra, ok := ctx.Value(streamingKey{}).(int64); ok {
		// A download streamed to a client: its read-ahead is bounded
		// on its own, in four parts when it allows (at least
		// minDownloadPartBytes each).
		part = int(min(int64(part), max(ra/4, minDownloadPartBytes)))
		conc = int(min(int64(conc), max(ra/int64(part), 1)))
	}
	if conc <= 1 {
		r, err := s.bucket.NewReader(ctx, key, nil)
		if err != nil {
			return nil, s.fail("download", full, err)
		}
		return &resumingReader{ctx: ctx, s: s, key: key, full: full, r: r, size: r.Size()}, nil
	}
	// The first part's GET also tells the object's size (from its
	// Content-Range), so a small object costs one request, as before.
	r, err := s.bucket.NewRangeReader(ctx, key, 0, int64(part), nil)
	if err != nil && httpStatus(err) == http.StatusRequestedRangeNotSatisfiable {
		// An empty object has no byte 0 to range over.
		r, err = s.bucket.NewReader(ctx, key, nil)
	}
	if err != nil {
		return nil, s.fail("download", full, err)
	}
	if r.Size() <= int64(part) {
		return &resumingReader{ctx: ctx, s: s, key: key, full: full, r: r, size: r.Size()}, nil
	}
	return newRangedReader(ctx, s, key, full, r, part, conc), nil
}

// streamingKey marks a download streamed to a client (WithStreaming); its
// value is the read-ahead bound in bytes.
type streamingKey struct{}

// WithStreaming returns ctx telling a Download that its bytes go to a
// client as they are read (the proxy's fetch side streams a large value):
// a Cached store does not keep them (the download bypasses the cache,
// however small the payload), and a cloud store's ranged download holds at
// most readAhead bytes of parts in flight (at least one part of 256 KiB),
// instead of download.part.bytes × download.concurrency, starts fetching
// them only at the first Read (opening it costs one GET, which tells the
// object's size and is closed at once: its first range is asked for again
// then), and gives each part's buffer back once it has been read
// and no range is left to fetch.
func WithStreaming(ctx context.Context, readAhead int64) context.Context {
	return context.WithValue(ctx, streamingKey{}, readAhead)
}

// streaming reports whether ctx is a streamed download's (WithStreaming).
func streaming(ctx context.Context) bool {
	_, ok := ctx.Value(streamingKey{}).(int64)
	return ok
}

// Budget is a wider memory budget that a store's download buffers are
// charged to (Options.DownloadBudget): Take takes n bytes without waiting
// (false: no room now), Give returns them. The proxy passes its
// proxy.memory.max.bytes budget.
type Budget struct {
	Take func(n int64) bool
	Give func(n int64)
}

// rangedReader reads an object larger than one part as consecutive ranges
// of s.dlPart bytes, fetched by up to s.dlConcurrency goroutines and handed
// to Read in order. Each range in flight or waiting to be read holds one
// buffer, and a buffer is taken before its range's GET starts and given back
// only when Read has used all of it, so a download holds at most
// dlPart × dlConcurrency bytes. A range whose GET fails with a retryable
// error is asked for again from the byte it reached, up to downloadResumes
// times. Ranges are not pinned to one version of the object: the objects
// Ferry writes are never rewritten with other bytes (gc's Touch copies an
// object onto itself), and the size and SHA-256 the reader's caller checks
// (largemessage.Deserializer) catch any mix.
//
// With a Budget (Options.DownloadBudget) each buffer is charged to it when
// made, without waiting: when it has no room the download goes on with the
// buffers it has, and one that has none reads the rest of the object as one
// stream, as a download did before ranged reads; so the budget's bound holds.
type rangedReader struct {
	ctx    context.Context
	cancel context.CancelFunc
	s      *BlobStore
	key    string
	full   string
	size   int64
	part   int             // bytes per range (s.dlPart, or less for a stream)
	parts  chan *rangePart // in object order
	slots  chan []byte     // free buffers; one token per part in flight
	wg     sync.WaitGroup

	// start, when set, is closed by the first Read (or Close): a
	// streamed download takes no buffer before its client reads it.
	start     chan struct{}
	startOnce sync.Once
	charged   atomic.Int64 // bytes of buffers charged to s.budget
	scheduled atomic.Bool  // every range has been started: a used buffer is not needed again

	cur *rangePart
	pos int   // bytes of cur already read
	off int64 // bytes handed to Read
	err error
}

// rangePart is one range of the object; done closes when buf holds it or
// err is set. A part with rc set is instead the rest of the object as one
// stream (no buffer: the budget had no room).
type rangePart struct {
	off  int64
	buf  []byte
	rc   io.ReadCloser
	done chan struct{}
	err  error
}

func newRangedReader(ctx context.Context, s *BlobStore, key, full string, first *blob.Reader, part, conc int) *rangedReader {
	ctx, cancel := context.WithCancel(ctx)
	rr := &rangedReader{ctx: ctx, cancel: cancel, s: s, key: key, full: full, size: first.Size(), part: part,
		parts: make(chan *rangePart, conc), slots: make(chan []byte, conc)}
	for range conc {
		rr.slots <- nil // buffers are made when first needed
	}
	if streaming(ctx) {
		// A streamed value's download is opened when its response is
		// built and read only when the proxy writes it, after the values
		// before it: its read-ahead starts then, so that the downloads
		// of a response's later values hold no memory meanwhile.
		rr.start = make(chan struct{})
	}
	rr.wg.Add(1)
	go rr.schedule(first)
	return rr
}

// schedule starts one fetch per range, in order, each once a buffer is free.
func (rr *rangedReader) schedule(first *blob.Reader) {
	defer rr.wg.Done()
	defer close(rr.parts)
	defer rr.scheduled.Store(true)
	defer func() {
		if first != nil {
			first.Close()
		}
	}()
	if rr.start != nil {
		// Its connection is not held while the value waits its turn (a
		// response may hold many): the first range is asked for again.
		first.Close()
		first = nil
		select {
		case <-rr.start:
		case <-rr.ctx.Done():
			return
		}
	}
	part := int64(rr.part)
	for off := int64(0); off < rr.size; {
		var buf []byte
		select {
		case buf = <-rr.slots:
		case <-rr.ctx.Done():
			return
		}
		n := min(part, rr.size-off)
		if int64(cap(buf)) < n {
			if !rr.charge(n) {
				if rr.charged.Load() > 0 {
					continue // one buffer fewer in flight; wait for the next
				}
				rr.streamRest(off, first)
				first = nil
				return
			}
			buf = make([]byte, n)
		}
		p := &rangePart{off: off, buf: buf[:n], done: make(chan struct{})}
		rr.wg.Add(1)
		go rr.fetch(p, first)
		first = nil
		rr.parts <- p // never blocks: a part in the queue holds a slot
		off += part
	}
}

// charge charges a new buffer of n bytes to the store's budget, if any.
func (rr *rangedReader) charge(n int64) bool {
	if b := rr.s.budget; b.Take != nil {
		if !b.Take(n) {
			return false
		}
		rr.charged.Add(n)
	}
	return true
}

// streamRest queues the rest of the object, from off, as one stream.
func (rr *rangedReader) streamRest(off int64, first *blob.Reader) {
	p := &rangePart{off: off, done: make(chan struct{})}
	if first != nil && off == 0 {
		first.Close() // it covers one range only
	}
	r, err := rr.s.bucket.NewRangeReader(rr.ctx, rr.key, off, -1, nil)
	if err != nil {
		p.err = rr.s.fail("download", rr.full, err)
	} else {
		p.rc = &resumingReader{ctx: rr.ctx, s: rr.s, key: rr.key, full: rr.full, r: r, size: rr.size, off: off}
	}
	close(p.done)
	rr.parts <- p
}

// fetch fills p.buf with its range, from r (the first range's open reader)
// or from new ranged GETs.
func (rr *rangedReader) fetch(p *rangePart, r *blob.Reader) {
	defer rr.wg.Done()
	defer close(p.done)
	got, resumes := 0, 0
	for {
		var err error
		if r == nil {
			r, err = rr.s.bucket.NewRangeReader(rr.ctx, rr.key, p.off+int64(got), int64(len(p.buf)-got), nil)
		}
		if err == nil {
			var k int
			k, err = io.ReadFull(r, p.buf[got:])
			got += k
			if err == nil {
				// Read to the end of the response, so that the HTTP
				// client may reuse the connection.
				var one [1]byte
				r.Read(one[:]) //nolint:errcheck // only draining
			}
			r.Close()
			r = nil
			if err == nil {
				return
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				p.err = &Error{Op: "download", Path: rr.full, Retryable: true,
					Err: fmt.Errorf("the object ended at byte %d, before the %d bytes it had when the download began (rewritten meanwhile?)", p.off+int64(got), rr.size)}
				return
			}
		}
		e := rr.s.fail("download", rr.full, err)
		if !IsRetryable(e) || resumes >= downloadResumes || rr.ctx.Err() != nil {
			p.err = e
			return
		}
		resumes++
	}
}

func (rr *rangedReader) Read(b []byte) (int, error) {
	rr.begin()
	if rr.err != nil {
		return 0, rr.err
	}
	if rr.cur != nil && rr.cur.rc != nil {
		n, err := rr.cur.rc.Read(b)
		rr.off += int64(n)
		if err != nil {
			rr.err = err
			if err == io.EOF && rr.off < rr.size {
				rr.err = &Error{Op: "download", Path: rr.full, Retryable: true,
					Err: fmt.Errorf("the object ended at byte %d, before the %d bytes it had when the download began (rewritten meanwhile?)", rr.off, rr.size)}
			}
			if n > 0 {
				return n, nil
			}
		}
		return n, rr.err
	}
	for rr.cur == nil || rr.pos == len(rr.cur.buf) {
		if rr.cur != nil {
			buf := rr.cur.buf
			if rr.scheduled.Load() {
				// No range is left to read into it: give it back now
				// rather than at Close (a streamed value's download
				// may be held long after it was read, until the rest
				// of its response has been written).
				rr.release(buf)
				buf = nil
			}
			rr.slots <- buf // never blocks: tokens are conserved
			rr.cur = nil
		}
		p, ok := <-rr.parts
		if !ok {
			if rr.off < rr.size {
				err := rr.ctx.Err()
				if err == nil {
					err = errors.New("download ended early")
				}
				rr.err = &Error{Op: "download", Path: rr.full, Err: err}
			} else {
				rr.err = io.EOF
			}
			return 0, rr.err
		}
		<-p.done
		if p.err != nil {
			rr.err = p.err
			return 0, rr.err
		}
		rr.cur, rr.pos = p, 0
		if p.rc != nil {
			return rr.Read(b)
		}
	}
	n := copy(b, rr.cur.buf[rr.pos:])
	rr.pos += n
	rr.off += int64(n)
	return n, nil
}

// begin lets a streamed download's fetches start.
func (rr *rangedReader) begin() {
	if rr.start != nil {
		rr.startOnce.Do(func() { close(rr.start) })
	}
}

// release gives back a used buffer's charge.
func (rr *rangedReader) release(buf []byte) {
	if n := int64(cap(buf)); n > 0 && rr.s.budget.Give != nil && rr.charged.Add(-n) >= 0 {
		rr.s.budget.Give(n)
	}
}

// Close stops the fetches still in flight and waits for them. It drops
// the reader's buffers as it gives back their charge, so that the memory
// is the collector's as soon as the budget counts it free, even while
// the reader itself is still referenced.
func (rr *rangedReader) Close() error {
	rr.cancel()
	rr.wg.Wait()
	if rr.cur != nil && rr.cur.rc != nil {
		rr.cur.rc.Close()
	}
	rr.cur = nil
	for p := range rr.parts { // a stream part not yet reached
		if p.rc != nil {
			p.rc.Close()
		}
	}
	for len(rr.slots) > 0 {
		<-rr.slots
	}
	if n := rr.charged.Swap(0); n > 0 {
		rr.s.budget.Give(n)
	}
	if rr.err == nil {
		rr.err = errors.New("payloadstore: read after Close")
	}
	return nil
}
