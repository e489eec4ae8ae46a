package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sync/semaphore"
)

// Configuration keys of the memory bounds (docs/SECURITY.md). They are
// proxy settings: the chain takes them through Options.
const (
	// KeyMemoryMax is the memory the proxy's variable buffers may hold at
	// once, in bytes, shared by every connection: frames read whole, and
	// the interceptors' decompressed records, decoded records, rewritten
	// batches and downloaded payloads.
	KeyMemoryMax = "proxy.memory.max.bytes"
	// KeyBatchDecompressedMax bounds the bytes one record batch may
	// decompress to.
	KeyBatchDecompressedMax = "interceptor.batch.decompressed.max.bytes"
	// KeyRequestDecompressedMax bounds the bytes all batches of one
	// request (or fetch response) may decompress to together.
	KeyRequestDecompressedMax = "interceptor.request.decompressed.max.bytes"
)

// Defaults of the memory bounds.
const (
	DefaultMemoryMax              = 512 << 20
	DefaultBatchDecompressedMax   = 100 << 20
	DefaultRequestDecompressedMax = 200 << 20
)

// Errors of the memory bounds. ErrDecompressedTooLarge is a property of the
// input (a batch, or a request, that decompresses past its bound): produce
// answers MESSAGE_TOO_LARGE (a Java producer splits the batch and retries).
// ErrMemoryBusy means the proxy-wide budget had no room within the call's
// time budget: produce answers REQUEST_TIMED_OUT (retriable).
var (
	ErrDecompressedTooLarge = errors.New("record batch decompresses past the configured bound")
	ErrMemoryBusy           = errors.New("interceptor memory budget exhausted (" + KeyMemoryMax + ")")
)

// Memory is the budget of KeyMemoryMax, shared by every call of a chain.
type Memory struct {
	sem   *semaphore.Weighted
	limit int64
	inUse atomic.Int64

	// reclaimers give back bytes held only to save work (payload caches)
	// when a charge finds no room; reclaimable counts those bytes, which
	// InUse leaves out.
	reclaimMu   sync.Mutex
	reclaimers  map[*func(int64) int64]struct{}
	reclaimable atomic.Int64

	// pool keeps the buffers of batches read in place for the next ones
	// (view.go), within the budget.
	pool bufPool
}

// takeReclaimable is TryTake for bytes a reclaimer holds (a cache entry):
// counted in the budget, not in InUse.
func (m *Memory) takeReclaimable(n int64) bool {
	if n <= 0 {
		return true
	}
	if !m.sem.TryAcquire(n) {
		return false
	}
	m.reclaimable.Add(n)
	return true
}

// giveReclaimable returns n bytes takeReclaimable took.
func (m *Memory) giveReclaimable(n int64) {
	if n <= 0 {
		return
	}
	m.reclaimable.Add(-n)
	m.sem.Release(n)
}

// Reclaimable returns the bytes of the budget that caches hold now (payloads
// kept by large-message, large.message.payload.cache.max.bytes; idle
// buffers of batches read in place, for the next batches), which a charge
// that finds no room takes back first. InUse leaves them out.
func (m *Memory) Reclaimable() int64 { return m.reclaimable.Load() }

// addReclaimer registers fn, which frees up to n bytes it holds in m and
// returns how many it freed; a charge that finds no room calls it before it
// waits. The returned function unregisters it.
func (m *Memory) addReclaimer(fn func(n int64) int64) (remove func()) {
	m.reclaimMu.Lock()
	defer m.reclaimMu.Unlock()
	if m.reclaimers == nil {
		m.reclaimers = map[*func(int64) int64]struct{}{}
	}
	p := &fn
	m.reclaimers[p] = struct{}{}
	return func() {
		m.reclaimMu.Lock()
		defer m.reclaimMu.Unlock()
		delete(m.reclaimers, p)
	}
}

// reclaim asks the reclaimers for n bytes; false when there are none.
func (m *Memory) reclaim(n int64) bool {
	m.reclaimMu.Lock()
	fns := make([]func(int64) int64, 0, len(m.reclaimers))
	for p := range m.reclaimers {
		fns = append(fns, *p)
	}
	m.reclaimMu.Unlock()
	var freed int64
	for _, fn := range fns {
		if freed >= n {
			break
		}
		freed += fn(n - freed)
	}
	return freed > 0
}

// NewMemory returns a budget of limit bytes (<= 0: DefaultMemoryMax).
func NewMemory(limit int64) *Memory {
	if limit <= 0 {
		limit = DefaultMemoryMax
	}
	m := &Memory{sem: semaphore.NewWeighted(limit), limit: limit}
	m.pool = bufPool{mem: m, max: poolMax(limit)}
	m.addReclaimer(m.pool.reclaim)
	return m
}

// Take takes n bytes for a caller outside the chain (the proxy's frame
// buffers), waiting while the budget is full until ctx ends. Errors wrap
// ErrMemoryBusy; n over the whole budget fails at once.
func (m *Memory) Take(ctx context.Context, n int64) error {
	l := ledger{mem: m}
	return l.charge(ctx, n)
}

// TakeUnqueued is Take without queueing behind larger waiters: it retries
// until the n bytes fit, with a backoff up to 100 ms, until ctx ends. For
// the proxy's frame buffers, so that a request waiting for a large room
// does not hold back a small one that fits now.
func (m *Memory) TakeUnqueued(ctx context.Context, n int64) error {
	if n > m.limit {
		return fmt.Errorf("%w: %d bytes needed at once, the budget is %d", ErrMemoryBusy, n, m.limit)
	}
	wait := time.Millisecond
	if m.TryTake(n) || m.reclaim(n) && m.TryTake(n) {
		return nil
	}
	for !m.TryTake(n) {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: no room for %d bytes: %v", ErrMemoryBusy, n, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
	return nil
}

// TryTake is Take without waiting: false when the budget has no room now
// (idle batch buffers, which the budget counts, are given up for it first).
func (m *Memory) TryTake(n int64) bool {
	if n <= 0 {
		return true
	}
	if !m.sem.TryAcquire(n) && !(m.pool.reclaim(n) > 0 && m.sem.TryAcquire(n)) {
		return false
	}
	m.inUse.Add(n)
	return true
}

// Give returns n bytes Take took.
func (m *Memory) Give(n int64) {
	l := ledger{mem: m, held: n}
	l.give(n)
}

// InUse returns the bytes charged now by work in progress (for metrics and
// tests); the bytes caches hold are not counted (Reclaimable).
func (m *Memory) InUse() int64 { return m.inUse.Load() }

// Limit returns the budget's size in bytes.
func (m *Memory) Limit() int64 { return m.limit }

// bounds are one request's decompression allowance, shared by its
// partitions' workers.
type bounds struct {
	batchMax, requestMax int64
	decompressed         atomic.Int64
}

// ledger is one worker's charges against a Memory and its request's
// bounds. It is used by one goroutine.
type ledger struct {
	mem  *Memory
	req  *bounds
	held int64
	// wait bounds how long a charge waits for room (the chain's time
	// budget: work outside an interceptor call is not timed otherwise);
	// 0: until ctx ends.
	wait time.Duration
	// closers are streams the work opened (streamed values' downloads),
	// closed by release.
	closers []io.Closer
	// chunks: the write chunks of streamed values (stream.go) are charged.
	chunks bool
	// outs are pooled batch buffers (outpool.go) given back by release.
	outs [][]byte
}

// charge takes n bytes from the budget, waiting while it is full until ctx
// ends (ErrMemoryBusy).
func (l *ledger) charge(ctx context.Context, n int64) error {
	if l == nil || l.mem == nil || n <= 0 {
		return nil
	}
	if n > l.mem.limit {
		return fmt.Errorf("%w: %d bytes needed at once, the budget is %d", ErrMemoryBusy, n, l.mem.limit)
	}
	// Room now, and no one queued before: taken without a timer (a
	// per-record Reserve must not cost a context and a timer each), as
	// Acquire would take it.
	if ctx.Err() == nil && (l.mem.sem.TryAcquire(n) || l.mem.reclaim(n) && l.mem.sem.TryAcquire(n)) {
		l.mem.inUse.Add(n)
		l.held += n
		return nil
	}
	if l.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.wait)
		defer cancel()
	}
	if err := l.mem.sem.Acquire(ctx, n); err != nil {
		return fmt.Errorf("%w: no room for %d bytes before the time budget ended", ErrMemoryBusy, n)
	}
	l.mem.inUse.Add(n)
	l.held += n
	return nil
}

// give returns n of the held bytes.
func (l *ledger) give(n int64) {
	if l == nil || l.mem == nil || n <= 0 {
		return
	}
	n = min(n, l.held)
	l.held -= n
	l.mem.inUse.Add(-n)
	l.mem.sem.Release(n)
}

// adopt takes over o's charges (o holds nothing afterwards).
func (l *ledger) adopt(o *ledger) {
	if l == nil || o == nil {
		return
	}
	l.held += o.held
	o.held = 0
	l.closers = append(l.closers, o.closers...)
	o.closers = nil
	l.outs = append(l.outs, o.outs...)
	o.outs = nil
}

// release returns everything held.
func (l *ledger) release() {
	if l != nil {
		l.give(l.held)
		for _, c := range l.closers {
			c.Close()
		}
		l.closers = nil
		for _, b := range l.outs {
			putOut(b)
		}
		l.outs = nil
	}
}

// Sizes of the decoded structures a batch's records become, charged with
// the bytes they come from (a record's header count is bounded by its
// bytes, but each header is 40 bytes decoded).
const (
	recordStructBytes = int64(unsafe.Sizeof(kmsg.Record{}))
	headerStructBytes = int64(unsafe.Sizeof(kmsg.Header{}))
)

// chargeStep is how much a growing decompression buffer takes from the
// budget at a time.
const chargeStep = 256 << 10

// budgetWriter collects decompressed bytes, charging the ledger as it grows
// and refusing more than max.
type budgetWriter struct {
	ctx     context.Context
	l       *ledger
	buf     []byte
	max     int64
	charged int64
	err     error
}

func (w *budgetWriter) Write(p []byte) (int, error) {
	if err := w.reserve(len(p)); err != nil {
		return 0, err
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// reserve makes room for n more bytes in w.buf, charging its growth: the
// new buffer is charged before it is made and the old one given back after
// the copy, so the budget holds the real peak (both, for a moment).
// Growth doubles (at least chargeStep) and never passes max, so the buffer
// is copied O(log n) times.
func (w *budgetWriter) reserve(n int) error {
	if w.err != nil {
		return w.err
	}
	need := int64(len(w.buf)) + int64(n)
	if need > w.max {
		w.err = ErrDecompressedTooLarge
		return w.err
	}
	if need <= int64(cap(w.buf)) {
		return nil
	}
	size := max(need, min(max(chargeStep, 2*int64(cap(w.buf))), w.max))
	if err := w.l.charge(w.ctx, size); err != nil {
		w.err = err
		return err
	}
	nb := make([]byte, len(w.buf), size)
	copy(nb, w.buf)
	w.l.give(w.charged)
	w.buf, w.charged = nb, size
	return nil
}

// decoderBytes is what a decoder in use holds, by codec, charged while it
// decompresses: gzip its 32 KiB window and buffers; lz4 a frame block (at
// most 4 MiB); zstd its window, bounded at 8 MiB here (franz-go writes
// 64 KiB windows, the Java client at most a few MiB), and block buffers.
// Snappy decodes into the output.
var decoderBytes = [...]int64{1: 256 << 10, 2: 0, 3: 4<<20 + 256<<10, 4: 10 << 20}

// decompress decompresses a batch's records with the codecs franz-go uses
// (klauspost gzip, snappy in raw and xerial framing, pierrec lz4, klauspost
// zstd), streaming into a buffer charged to l as it grows, and stops with
// ErrDecompressedTooLarge past the batch's or the request's bound. It never
// allocates from a size the input claims. franz-go's own decompressor takes
// its bound once, at construction, and cannot charge a shared budget as its
// output grows: hence this wiring of the same libraries.
//
// buf (length 0) is a buffer to decompress into, from a batch done: its
// capacity is charged to l first, and used as far as it goes.
func decompress(ctx context.Context, l *ledger, codec int16, src, buf []byte) ([]byte, error) {
	limit := int64(1<<62 - 1)
	if l != nil && l.req != nil {
		if l.req.batchMax > 0 {
			limit = l.req.batchMax
		}
		if l.req.requestMax > 0 {
			limit = min(limit, l.req.requestMax-l.req.decompressed.Load())
		}
	}
	w := &budgetWriter{ctx: ctx, l: l, max: max(limit, 0)}
	if c := int64(cap(buf)); c > 0 && c <= w.max {
		if err := l.charge(ctx, c); err != nil {
			return nil, err
		}
		w.buf, w.charged = buf[:0], c
	}
	if codec > 0 && int(codec) < len(decoderBytes) {
		n := decoderBytes[codec]
		if err := l.charge(ctx, n); err != nil {
			return nil, err
		}
		defer l.give(n)
	}
	var err error
	switch codec {
	case 1:
		err = withPooled(&gzipReaders, func(r *gzip.Reader) error {
			if err := r.Reset(bytes.NewReader(src)); err != nil {
				return err
			}
			r.Multistream(true)
			_, err := io.Copy(w, r)
			return err
		})
	case 2:
		err = unsnappy(w, src)
	case 3:
		err = withPooled(&lz4Readers, func(r *lz4.Reader) error {
			r.Reset(bytes.NewReader(src))
			_, err := io.Copy(w, r)
			return err
		})
	case 4:
		err = withPooled(&zstdReaders, func(r *zstdReader) error {
			if err := r.d.Reset(bytes.NewReader(src)); err != nil {
				return err
			}
			_, err := io.Copy(w, r.d)
			return err
		})
	default:
		return nil, fmt.Errorf("unknown compression codec %d", codec)
	}
	if w.err != nil {
		err = w.err
	}
	if l != nil && l.req != nil {
		l.req.decompressed.Add(int64(len(w.buf)))
	}
	if err != nil {
		if errors.Is(err, ErrDecompressedTooLarge) {
			return nil, fmt.Errorf("%w (%s %d, %s %d)", ErrDecompressedTooLarge, KeyBatchDecompressedMax, l.req.batchMax, KeyRequestDecompressedMax, l.req.requestMax)
		}
		return nil, err
	}
	return w.buf, nil
}

// xerialHeader starts the snappy framing the Java client writes: a magic,
// then version and compatible version (int32 each), then blocks of an
// int32 length and a raw snappy block.
var xerialMagic = []byte{130, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

func unsnappy(w *budgetWriter, src []byte) error {
	block := func(b []byte) error {
		n, err := s2.DecodedLen(b)
		if err != nil {
			return err
		}
		// Room (charged) first, then decode into it: s2 writes into dst
		// when dst is long enough.
		if err := w.reserve(n); err != nil {
			return err
		}
		at := len(w.buf)
		out, err := s2.Decode(w.buf[at:at+n], b)
		if err != nil {
			return err
		}
		if len(out) != n || (n > 0 && &out[0] != &w.buf[at : at+n][0]) {
			return errors.New("snappy: decoded length differs from the block's header")
		}
		w.buf = w.buf[:at+n]
		return nil
	}
	if len(src) < 16 || !bytes.HasPrefix(src, xerialMagic) {
		return block(src)
	}
	rest := src[16:]
	for len(rest) > 0 {
		if len(rest) < 4 {
			return errors.New("snappy (xerial): truncated block length")
		}
		n := int64(binary.BigEndian.Uint32(rest))
		rest = rest[4:]
		if n > int64(len(rest)) {
			return errors.New("snappy (xerial): block longer than its batch")
		}
		if err := block(rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

type zstdReader struct{ d *zstd.Decoder }

var (
	gzipReaders = sync.Pool{New: func() any { return new(gzip.Reader) }}
	lz4Readers  = sync.Pool{New: func() any { return lz4.NewReader(nil) }}
	zstdReaders = sync.Pool{New: func() any {
		// Low memory, one goroutine, and a window bound: the decoder's
		// own allocations stay small whatever the frame header claims.
		d, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(8<<20), zstd.WithDecoderMaxMemory(1<<31))
		return &zstdReader{d: d}
	}}
)

// withPooled runs fn with a reader from pool and puts it back.
func withPooled[T any](pool *sync.Pool, fn func(T) error) error {
	r := pool.Get().(T)
	defer pool.Put(r)
	return fn(r)
}
