package interceptor

import (
	"context"
	"errors"
	"hash/crc32"
	"sync"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A batch is read in place (issue 19): each record is a view over the
// batch's records section (decompressed when the batch is compressed), its
// key, value and header values sub-slices of it and its header names
// strings over it. An interceptor sees a Record filled from a view; only a
// record that changed, was skipped or has deferred work makes the chain
// build kmsg records (materialize) and encode the batch. A batch whose
// records all stay as they came goes out as its bytes: no record
// allocated, nothing encoded or compressed, the same CRC.

// recView is one record of a batch, read in place.
type recView struct {
	raw        []byte // the record's bytes, its length varint included
	tsDelta    int64
	offDelta   int32
	key, value []byte // nil: Kafka's null
	h0, h1     int32  // its headers: batch.hdrs[h0:h1]
}

// Sizes charged to the memory budget for a batch read in place: a view
// per record, each header twice (the original, and the copy the
// interceptors get, which they may change in place), and one spare header
// per record (the copy's room for one more: encrypt's marker,
// large-message's header, appended without an allocation).
const (
	viewBytes = int64(unsafe.Sizeof(recView{}))
	hdrBytes  = int64(unsafe.Sizeof(Header{}))
)

// scratch is what reading a batch in place needs besides the batch's
// bytes: views, headers, the decompressed records. It is reused from
// batch to batch (Memory's pool).
type scratch struct {
	views []recView
	hdrs  []Header // the records' headers as read
	work  []Header // the copies handed to interceptors, with a spare slot each
	buf   []byte   // decompressed records
	// outs hold the fields interceptors write for the batch's records
	// (Record.buffer: encrypt's sealed and opened values), in chunks
	// filled in turn: outs[k][len(outs[k]):] is free.
	outs [][]byte
	// recs, from and karena are the last batch's materialized records
	// (decodedBatch's fields of these names), kept for their capacity:
	// a rewritten batch allocates none of them once its scratch is
	// reused.
	recs   []kmsg.Record
	from   []int32
	karena []kmsg.Header
}

func (s *scratch) size() int64 {
	return int64(cap(s.views))*viewBytes + int64(cap(s.hdrs)+cap(s.work))*hdrBytes + int64(cap(s.buf)) + s.outsSize() +
		int64(cap(s.recs))*recordStructBytes + int64(cap(s.from))*4 + int64(cap(s.karena))*kmsgHdrBytes
}

// kmsgHdrBytes is the size of a materialized record's header.
const kmsgHdrBytes = int64(unsafe.Sizeof(kmsg.Header{}))

// outsSize is the capacity of s.outs' chunks.
func (s *scratch) outsSize() int64 {
	var n int64
	for _, c := range s.outs {
		n += int64(cap(c))
	}
	return n
}

// scanBatch checks raw's magic and CRC and reads its records in place
// (views), decompressing them within l's bounds (see decompress) and
// charging l for the decompressed bytes and the views. It never panics on
// bad input: errors say what is wrong (an *errBatch, errMagic,
// ErrDecompressedTooLarge or ErrMemoryBusy). l may be nil (no bounds, no
// pooled buffers).
func scanBatch(ctx context.Context, l *ledger, raw []byte) (*decodedBatch, error) {
	if len(raw) <= magicOffset {
		return nil, corrupt("record batch of %d bytes is truncated", len(raw))
	}
	if raw[magicOffset] != 2 {
		return nil, errMagic
	}
	if len(raw) < batchHeaderLen {
		return nil, corrupt("record batch of %d bytes is shorter than its %d-byte header", len(raw), batchHeaderLen)
	}
	d := &decodedBatch{}
	if err := d.hdr.ReadFrom(raw); err != nil {
		return nil, corrupt("record batch: %v", err)
	}
	if got := crc32.Checksum(raw[attrOffset:], castagnoli); got != uint32(d.hdr.CRC) {
		return nil, corrupt("record batch CRC-32C is %08x, its header says %08x", got, uint32(d.hdr.CRC))
	}
	if d.hdr.NumRecords < 0 {
		return nil, corrupt("record batch says it holds %d records", d.hdr.NumRecords)
	}
	codec := d.hdr.Attributes & attrCodecMask
	if int(codec) >= len(codecNames) {
		return nil, corrupt("record batch uses unknown compression codec %d", codec)
	}
	held := heldOf(l)
	defer func() { d.transient = heldOf(l) - held }()
	if l != nil && l.mem != nil {
		d.sc = l.mem.pool.get()
	}
	if d.sc == nil {
		d.sc = &scratch{}
	}
	src := d.hdr.Records
	if codec != 0 {
		out, err := decompress(ctx, l, codec, src, d.sc.buf[:0])
		if err != nil {
			var eb *errBatch
			if errors.Is(err, ErrDecompressedTooLarge) || errors.Is(err, ErrMemoryBusy) || errors.As(err, &eb) {
				return d.fail(l, held, err)
			}
			return d.fail(l, held, corrupt("record batch: %s decompression failed: %v", codecNames[codec], err))
		}
		src, d.sc.buf = out, out
	}
	d.recordsLen = int64(len(src))
	// A record is at least 7 bytes: bound the views by the input.
	n := int(d.hdr.NumRecords)
	if int64(n) > int64(len(src))/7+1 {
		return d.fail(l, held, corrupt("record batch says it holds %d records in %d bytes", n, len(src)))
	}
	if err := l.charge(ctx, int64(n)*(viewBytes+hdrBytes)); err != nil {
		return d.fail(l, held, err)
	}
	if cap(d.sc.views) < n {
		d.sc.views = make([]recView, n)
	}
	d.views = d.sc.views[:n]
	hdrs := d.sc.hdrs[:0]
	for i := range d.views {
		v := &d.views[i]
		ln, vl := kbin.Varint(src)
		if vl <= 0 || ln < 0 || int64(vl)+int64(ln) > int64(len(src)) {
			return d.fail(l, held, corrupt("record %d of the batch is truncated", i))
		}
		rec := src[:vl+int(ln)]
		src = src[vl+int(ln):]
		b := kbin.Reader{Src: rec[vl:]}
		b.Int8() // attributes (unused in v2 records)
		v.raw = rec
		v.tsDelta = b.Varlong()
		v.offDelta = b.Varint()
		v.key = b.VarintBytes()
		v.value = b.VarintBytes()
		nh := b.Varint()
		if !b.Ok() || int64(nh) > int64(len(b.Src)) {
			return d.fail(l, held, corrupt("record %d of the batch: %v", i, kbin.ErrNotEnoughData))
		}
		v.h0 = int32(len(hdrs))
		if nh > 0 {
			// Headers are 2 bytes on the wire at least: charged
			// before they are read (twice: see hdrBytes).
			if err := l.charge(ctx, 2*int64(nh)*hdrBytes); err != nil {
				return d.fail(l, held, err)
			}
			for range nh {
				k := b.VarintBytes()
				hv := b.VarintBytes()
				hdrs = append(hdrs, Header{Key: unsafe.String(unsafe.SliceData(k), len(k)), Value: hv})
			}
			if !b.Ok() {
				return d.fail(l, held, corrupt("record %d of the batch: %v", i, kbin.ErrNotEnoughData))
			}
		}
		v.h1 = int32(len(hdrs))
	}
	d.sc.hdrs = hdrs
	if cap(d.sc.work) < len(hdrs)+n {
		d.sc.work = make([]Header, len(hdrs)+n)
	}
	for k := range d.sc.outs {
		d.sc.outs[k] = d.sc.outs[k][:0]
	}
	if len(src) != 0 {
		return d.fail(l, held, corrupt("record batch has %d bytes after its %d records", len(src), d.hdr.NumRecords))
	}
	return d, nil
}

// headersOf returns view i's headers as read (nil when none); they must
// not be changed.
func (d *decodedBatch) headersOf(i int) []Header {
	v := &d.views[i]
	if v.h0 == v.h1 {
		return nil
	}
	return d.sc.hdrs[v.h0:v.h1:v.h1]
}

// fill sets r to record i of the batch as an interceptor sees it: key,
// value and header values are the batch's bytes; the headers slice is a
// copy the interceptor may change in place, with room for one more header
// (its array is the record's alone while the batch is processed; empty,
// not nil, when the record has none).
func (d *decodedBatch) fill(r *Record, i int, topic string, partition int32, info BatchInfo, fetch bool, led *ledger) {
	v := &d.views[i]
	*r = Record{Topic: topic, Partition: partition, Key: v.key, Value: v.value, Batch: info,
		Timestamp: d.hdr.FirstTimestamp + v.tsDelta, Offset: int64(i), led: led, batch: d, index: i}
	if fetch {
		r.Offset = d.hdr.FirstOffset + int64(v.offDelta)
		if d.hdr.Attributes&0x08 != 0 { // LogAppendTime
			r.Timestamp = d.hdr.MaxTimestamp
		}
	}
	// Record i's copy starts after i spare slots, one per record before.
	w0, w1 := int(v.h0)+i, int(v.h1)+i
	r.Headers = d.sc.work[w0 : w1 : w1+1]
	copy(r.Headers, d.sc.hdrs[v.h0:v.h1])
}

// alloc returns n bytes that live as long as the batch, for a field an
// interceptor writes into record i (Record.buffer): carved from the
// scratch's chunks in turn, reused from batch to batch, each charged to l
// when the batch first takes from it. When they run out, a new chunk is
// added, sized for the rest of the batch as its records so far suggest
// (records alike: the chunks fit the next such batch, which allocates
// nothing). The charges are the batch's transient ones, given back at
// done.
func (d *decodedBatch) alloc(ctx context.Context, l *ledger, i, n int) ([]byte, error) {
	s := d.sc
	bound := d.recordsLen + int64(len(d.views))<<10 // what a batch's fields are likely to need, at most
	if d.outAt == 0 && !d.outHeld && s.outsSize() > 2*bound+64<<10 {
		s.outs = s.outs[:0] // a larger batch's: not charged to this one
	}
	for ; d.outAt < len(s.outs); d.outAt, d.outHeld = d.outAt+1, false {
		c := s.outs[d.outAt]
		if cap(c)-len(c) < n {
			continue
		}
		if !d.outHeld {
			if err := l.charge(ctx, int64(cap(c))); err != nil {
				return nil, err
			}
			d.transient += int64(cap(c))
			d.outHeld = true
		}
		s.outs[d.outAt] = c[:len(c)+n]
		d.outUsed += int64(n)
		return c[len(c) : len(c)+n : len(c)+n], nil
	}
	done := int64(min(max(i, 0), len(d.views)-1)) + 1 // records up to i
	rest := (d.outUsed + int64(n)) * (int64(len(d.views)) - done) / done
	size := max(int64(n)+min(rest, bound), 4<<10)
	if err := l.charge(ctx, size); err != nil {
		return nil, err
	}
	d.transient += size
	c := make([]byte, n, size)
	s.outs = append(s.outs, c)
	d.outAt, d.outHeld = len(s.outs)-1, true
	d.outUsed += int64(n)
	return c[:n:n], nil
}

// buffer returns n bytes for a field the interceptor writes into r (a
// sealed or opened value), charged to the memory budget and given back
// when the batch is done: from the batch's pooled buffer (no allocation
// per record) when r was read in place, else a new slice charged as
// Reserve charges. Errors wrap ErrMemoryBusy.
func (r *Record) buffer(ctx context.Context, n int) ([]byte, error) {
	if r.batch != nil && r.batch.sc != nil {
		return r.batch.alloc(ctx, r.led, r.index, n)
	}
	if err := r.Reserve(ctx, int64(n)); err != nil {
		return nil, err
	}
	return make([]byte, n), nil
}

// changed reports whether r differs from record i as read (Kafka's null
// distinct from empty). Unchanged fields are the same slices: compared in
// constant time.
func (d *decodedBatch) changed(r *Record, i int) bool {
	v := &d.views[i]
	if !sameBytes(r.Key, v.key) || !sameBytes(r.Value, v.value) {
		return true
	}
	hs := d.headersOf(i)
	if len(r.Headers) != len(hs) {
		return true
	}
	for j := range hs {
		if r.Headers[j].Key != hs[j].Key || !sameBytes(r.Headers[j].Value, hs[j].Value) {
			return true
		}
	}
	return false
}

// wireLen is record i's length in a records section as the chain would
// encode it (recordWireLen of its kmsg record), computed from the view.
func (d *decodedBatch) wireLen(i int) int64 {
	v := &d.views[i]
	n := 1 + kbin.VarlongLen(v.tsDelta) + kbin.VarintLen(v.offDelta) + varintBytesLen(v.key) + varintBytesLen(v.value) +
		kbin.VarintLen(v.h1-v.h0)
	for _, h := range d.headersOf(i) {
		n += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + varintBytesLen(h.Value)
	}
	return int64(kbin.VarintLen(int32(n)) + n)
}

// record returns record i as read, as a kmsg record (its headers a new
// slice: kmsg.Header is not Header).
func (d *decodedBatch) record(i int) kmsg.Record {
	v := &d.views[i]
	kr := kmsg.Record{Length: int32(len(v.raw)), TimestampDelta: int32(v.tsDelta), TimestampDelta64: v.tsDelta,
		OffsetDelta: v.offDelta, Key: v.key, Value: v.value}
	if hs := d.headersOf(i); len(hs) > 0 {
		kr.Headers = d.kmsgHeaders(hs)
	}
	return kr
}

// kmsgHeaders copies hs into the batch's arena of kmsg headers (one
// allocation per batch, not per record) and returns the copy, whose
// capacity ends with it.
func (d *decodedBatch) kmsgHeaders(hs []Header) []kmsg.Header {
	if cap(d.karena)-len(d.karena) < len(hs) {
		if d.karena == nil && d.sc != nil && cap(d.sc.karena) >= len(hs) {
			d.karena = d.sc.karena[:0] // the scratch's, this batch's first
			d.sc.karena = nil          // taken: given back by keepMaterialized
			return d.kmsgHeaders(hs)
		}
		d.karena = make([]kmsg.Header, 0, max(2*cap(d.karena), len(hs), 64))
	}
	start := len(d.karena)
	for _, h := range hs {
		d.karena = append(d.karena, kmsg.Header{Key: h.Key, Value: h.Value})
	}
	return d.karena[start:len(d.karena):len(d.karena)]
}

// materialize returns records [0, n) as kmsg records, charging l for them
// (given back with the batch's other transient charges at done).
func (d *decodedBatch) materialize(ctx context.Context, l *ledger, n int) ([]kmsg.Record, error) {
	if err := l.charge(ctx, int64(len(d.views))*recordStructBytes); err != nil {
		return nil, err
	}
	d.transient += int64(len(d.views)) * recordStructBytes
	var recs []kmsg.Record
	if s := d.sc; s != nil && cap(s.recs) >= len(d.views) && cap(s.from) >= len(d.views) {
		// The scratch's arrays, taken (given back by keepMaterialized).
		recs, d.from = s.recs[:n], s.from[:n]
		s.recs, s.from = nil, nil
	} else {
		recs = make([]kmsg.Record, n, len(d.views))
		d.from = make([]int32, n, len(d.views))
	}
	for i := range recs {
		recs[i] = d.record(i)
		d.from[i] = int32(i)
	}
	return recs, nil
}

// setFrom writes r's key, value and headers into kr, a record of d.
func (d *decodedBatch) setFrom(kr *kmsg.Record, r *Record) {
	kr.Key, kr.Value = r.Key, r.Value
	kr.Headers = d.kmsgHeaders(r.Headers)
}

// bufPool keeps the scratch of batches done for the next ones. Idle
// scratch counts in the memory budget as reclaimable bytes: a charge that
// finds no room frees it first. It keeps at most max bytes, and no scratch
// larger than that.
type bufPool struct {
	mu   sync.Mutex
	mem  *Memory
	free []*scratch
	idle int64
	max  int64
}

// poolMax is how much idle scratch a budget of limit bytes keeps: an
// eighth of it, at most 64 MiB.
func poolMax(limit int64) int64 { return min(limit/8, 64<<20) }

// get returns a scratch of a batch done, or nil.
func (p *bufPool) get() *scratch {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.free)
	if n == 0 {
		return nil
	}
	s := p.free[n-1]
	p.free[n-1] = nil
	p.free = p.free[:n-1]
	size := s.size()
	p.idle -= size
	p.mem.giveReclaimable(size)
	return s
}

// put keeps s for a later batch if the pool and the budget have room.
func (p *bufPool) put(s *scratch) {
	size := s.size()
	if size == 0 || size > p.max {
		return
	}
	clear(s.hdrs[:cap(s.hdrs)]) // no string or slice kept alive by an idle scratch
	clear(s.work[:cap(s.work)])
	clear(s.views[:cap(s.views)])
	clear(s.recs[:cap(s.recs)])
	clear(s.karena[:cap(s.karena)])
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle+size > p.max || !p.mem.takeReclaimable(size) {
		return
	}
	p.free = append(p.free, s)
	p.idle += size
}

// reclaim drops idle scratch for a charge that found no room.
func (p *bufPool) reclaim(n int64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var freed int64
	for len(p.free) > 0 && freed < n {
		s := p.free[len(p.free)-1]
		p.free[len(p.free)-1] = nil
		p.free = p.free[:len(p.free)-1]
		size := s.size()
		p.idle -= size
		p.mem.giveReclaimable(size)
		freed += size
	}
	return freed
}

// count is the number of records the batch holds now.
func (d *decodedBatch) count() int {
	if d.recs != nil {
		return len(d.recs)
	}
	return len(d.views)
}
