package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Magic v2 record batch layout (Kafka's DefaultRecordBatch): the CRC-32C at
// byte 17 covers everything from the attributes (byte 21) to the end.
const (
	batchHeaderLen = 61 // 8 offset + 4 length + 49 after the length
	lengthOffset   = 8
	magicOffset    = 16
	crcOffset      = 17
	attrOffset     = 21

	attrCodecMask     = 0x07
	attrTransactional = 0x10
	attrControl       = 0x20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var codecNames = [...]string{"none", "gzip", "snappy", "lz4", "zstd"}

// codecName names the codec of a batch's attributes.
func codecName(attrs int16) string {
	if c := int(attrs & attrCodecMask); c < len(codecNames) {
		return codecNames[c]
	}
	return fmt.Sprintf("unknown codec %d", attrs&attrCodecMask)
}

// errBatch is a malformed batch; on produce it is CORRUPT_MESSAGE.
type errBatch struct{ msg string }

func (e *errBatch) Error() string { return e.msg }

func corrupt(format string, args ...any) error { return &errBatch{fmt.Sprintf(format, args...)} }

// errMagic is a v0/v1 message set on a topic an interceptor matches.
var errMagic = errors.New("message format v0/v1 (magic < 2) cannot be intercepted; only record batches (magic v2) can")

// splitBatch returns the first batch of b (its raw bytes) and the rest.
// complete is false when b holds only the start of a batch (a fetch
// response cut at its size limit).
func splitBatch(b []byte) (raw, rest []byte, complete bool) {
	if len(b) < lengthOffset+4 {
		return nil, b, false
	}
	n := int64(int32(binary.BigEndian.Uint32(b[lengthOffset:])))
	total := lengthOffset + 4 + n
	if n < 0 || total > int64(len(b)) {
		return nil, b, false
	}
	return b[:total], b[total:], true
}

// decodedBatch is a magic v2 batch read in place (views, see view.go),
// its records materialized as kmsg records only when the batch must be
// encoded again.
type decodedBatch struct {
	hdr kmsg.RecordBatch // Records holds the wire (compressed) records
	// views are the records read in place, over sc's buffers and the
	// batch's bytes.
	views []recView
	sc    *scratch
	// recordsLen is the length of the (decompressed) records section.
	recordsLen int64
	// recs are the records to encode: nil until a record changed, was
	// skipped or has deferred work (then materialized from the views).
	recs []kmsg.Record
	// from[k] is the view recs[k] is as read, unchanged (its bytes are
	// copied as they are by encode), or -1: recs[k] is encoded from its
	// fields. nil: every record is encoded from its fields.
	from []int32
	// karena holds the materialized records' headers.
	karena []kmsg.Header
	// pinned: deferred work may hold the views' bytes after the batch is
	// done, so its scratch is not reused.
	pinned bool
	// outAt is the chunk of the scratch's outs alloc takes from, outHeld
	// whether it is charged to this batch; outUsed: the bytes alloc gave
	// out for its records.
	outAt   int
	outHeld bool
	outUsed int64
	// transient is what decoding charged to the ledger (decompressed
	// bytes, views and decoded structures), given back once the batch is
	// done.
	transient int64
	// holes are the kept records whose values are streamed (stream.go);
	// with any, the batch is written by encodeStreamed.
	holes []holeRec
	// headroom: encode leaves this many bytes in front of the batch, for
	// the caller to fill (the record set the batch follows), so a large
	// batch is never copied to be joined to a small prefix.
	headroom int
	// into: encode appends the batch to *into (the partition's output so
	// far, grown when it must be) and returns the appended bytes, instead
	// of encoding it into a buffer of its own to be copied there (encrypt
	// on fetch rewrites every batch of a response: one allocation and one
	// copy per batch).
	into *[]byte
	// pooled: an uncompressed batch is encoded into a pooled buffer
	// (outpool.go), given back when the ledger is released: the batch is
	// copied before (a Produce request's, which the proxy encodes into the
	// request it forwards), and no deferred work holds its bytes.
	pooled bool
}

// decodeBatch is scanBatch with every record materialized (d.recs), for
// callers that want kmsg records; the chain reads batches in place.
func decodeBatch(ctx context.Context, l *ledger, raw []byte) (*decodedBatch, error) {
	d, err := scanBatch(ctx, l, raw)
	if err != nil {
		return nil, err
	}
	d.pinned = true // the records alias the scratch
	if d.recs, err = d.materialize(ctx, l, len(d.views)); err != nil {
		d.done(l)
		return nil, err
	}
	d.from = nil // the caller may change the records: encode writes them from their fields
	return d, nil
}

// recordWireLen is the length of r in a batch's records section, its
// length varint included.
func recordWireLen(r *kmsg.Record) int64 {
	n := recordBodyLen(r)
	return int64(kbin.VarintLen(int32(n)) + n)
}

// recordBodyLen is the length of r's encoding after its length varint
// (the Length field kmsg writes), as kmsg's Record.AppendTo encodes it.
func recordBodyLen(r *kmsg.Record) int {
	ts := r.TimestampDelta64
	if ts == 0 {
		ts = int64(r.TimestampDelta) // kmsg's fallback
	}
	n := 1 + kbin.VarlongLen(ts) + kbin.VarintLen(r.OffsetDelta) +
		varintBytesLen(r.Key) + varintBytesLen(r.Value) + kbin.VarintLen(int32(len(r.Headers)))
	for _, h := range r.Headers {
		n += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + varintBytesLen(h.Value)
	}
	return n
}

func varintBytesLen(b []byte) int {
	if b == nil {
		return 1 // -1
	}
	return kbin.VarintLen(int32(len(b))) + len(b)
}

// fail gives back what decoding charged and returns err.
func (d *decodedBatch) fail(l *ledger, held int64, err error) (*decodedBatch, error) {
	l.give(heldOf(l) - held)
	return nil, err
}

// done gives back the batch's transient charges and its scratch, for
// the next batch (unless pinned). The batch's views must not be used
// afterwards.
func (d *decodedBatch) done(l *ledger) {
	l.give(d.transient)
	d.transient = 0
	if d.sc != nil && !d.pinned && l != nil && l.mem != nil {
		d.keepMaterialized()
		l.mem.pool.put(d.sc)
	}
	d.sc, d.views = nil, nil
}

func heldOf(l *ledger) int64 {
	if l == nil {
		return 0
	}
	return l.held
}

// encode builds the batch's wire bytes (after d.headroom bytes left for the
// caller, or appended to *d.into: then it returns the appended bytes):
// records encoded with their lengths,
// compressed with the batch's codec by franz-go's compressor, the length
// and CRC-32C recomputed. All other header fields are taken from d.hdr. The
// output is charged to l (it lives until the request is forwarded or the
// response written); the uncompressed records section is transient.
func (d *decodedBatch) encode(ctx context.Context, l *ledger) ([]byte, error) {
	size := int64(batchHeaderLen)
	for i := range d.recs {
		if raw := d.rawOf(i); raw != nil {
			size += int64(len(raw))
			continue
		}
		size += recordWireLen(&d.recs[i])
	}
	// Charged before the batch is built: it may hold payloads just put
	// back (large-message on fetch). Uncompressed, the records are written
	// in place after the header's room; compressed, into a buffer that the
	// compressed output then replaces.
	room := d.headroom
	size += int64(room)
	codec := d.hdr.Attributes & attrCodecMask
	pooled := d.pooled && d.into == nil && room == 0 && codec == 0 && l != nil
	if pooled {
		_, capacity, _ := outClass(int(size))
		size = int64(capacity) // charged as it is held
	}
	if err := l.charge(ctx, size); err != nil {
		return nil, err
	}
	// base: where the batch starts in buf; with d.into, after the output
	// the batch is appended to (room is then 0).
	base := 0
	var buf []byte
	switch {
	case d.into != nil:
		base, room = len(*d.into), 0
		// Grown by doubling at least, only if the caller's room (an
		// estimate from the batches as they came) is short. (Asked for
		// max(size, base) whatever the room, the output was copied into a
		// buffer twice as large once it passed half of the one reserved.)
		buf = *d.into
		if n := int(size); cap(buf)-base < n {
			buf = growOut(l, d.pooled, buf, max(n, base))
		}
		buf = buf[:base+batchHeaderLen]
	case pooled:
		buf = getOut(int(size))[:batchHeaderLen]
		l.outs = append(l.outs, buf)
	default:
		buf = make([]byte, room+batchHeaderLen, size)
	}
	room += base // the header's place, from here on
	var tmp []byte
	for i := range d.recs {
		if raw := d.rawOf(i); raw != nil {
			buf = append(buf, raw...) // unchanged: its bytes as they came
			continue
		}
		r := &d.recs[i]
		// Encoded in place with its length known in advance: a record
		// (a payload put back, say 100 MiB) is copied once, not twice.
		start := len(buf)
		r.Length = int32(recordBodyLen(r))
		buf = r.AppendTo(buf)
		if len(buf)-start == int(recordWireLen(r)) {
			continue
		}
		// A field the length did not foresee: measured by encoding.
		buf = buf[:start]
		r.Length = 0
		tmp = r.AppendTo(tmp[:0]) // a 1-byte zero length, then the body
		r.Length = int32(len(tmp) - 1)
		buf = kbin.AppendVarint(buf, r.Length)
		buf = append(buf, tmp[1:]...)
	}
	recs := buf[room+batchHeaderLen:]
	if codec != 0 {
		comp, err := compress(kgo.CompressionCodecType(codec), recs)
		if err != nil {
			l.give(size)
			return nil, err
		}
		if err := l.charge(ctx, int64(room-base+batchHeaderLen+len(comp))); err != nil {
			l.give(size)
			return nil, err
		}
		l.give(size) // the uncompressed section is garbage once copied
		if d.into != nil {
			buf = append(buf[:room+batchHeaderLen], comp...)
		} else {
			buf = append(make([]byte, room+batchHeaderLen, room+batchHeaderLen+len(comp)), comp...)
		}
		recs = buf[room+batchHeaderLen:]
	}
	h := d.hdr
	h.Records = nil // already in place after the header: not copied onto themselves
	h.NumRecords = int32(len(d.recs))
	h.Length = int32(batchHeaderLen - lengthOffset - 4 + len(recs))
	h.CRC = 0
	// The header (batchHeaderLen bytes) is written over the room left
	// for it.
	h.AppendTo(buf[room:room])
	out := buf[room : room+batchHeaderLen+len(recs)]
	binary.BigEndian.PutUint32(out[crcOffset:], crc32.Checksum(out[attrOffset:], castagnoli))
	if d.into != nil {
		*d.into = buf[:room+len(out)]
		return out, nil
	}
	return buf[:room+len(out)], nil
}

// keepMaterialized gives the batch's materialized records' arrays to its
// scratch for the next batch, the larger of them and what the scratch
// holds. The batch's records must not be used afterwards.
func (d *decodedBatch) keepMaterialized() {
	s := d.sc
	if cap(d.recs) > cap(s.recs) {
		s.recs = d.recs[:0]
	}
	if cap(d.from) > cap(s.from) {
		s.from = d.from[:0]
	}
	if cap(d.karena) > cap(s.karena) {
		s.karena = d.karena[:0]
	}
	d.recs, d.from, d.karena = nil, nil, nil
}

// rawOf returns the bytes of recs[i] as read when it is unchanged, else nil.
func (d *decodedBatch) rawOf(i int) []byte {
	if i >= len(d.from) || d.from[i] < 0 || int(d.from[i]) >= len(d.views) {
		return nil
	}
	return d.views[d.from[i]].raw
}

// edited marks recs[i] as changed: encode writes it from its fields.
func (d *decodedBatch) edited(i int) {
	if i < len(d.from) {
		d.from[i] = -1
	}
}

var (
	compMu      sync.Mutex
	compressors = map[kgo.CompressionCodecType]kgo.Compressor{}
)

// compress compresses src with codec exactly as franz-go compresses a
// produce batch at the codec's default level.
func compress(codec kgo.CompressionCodecType, src []byte) ([]byte, error) {
	compMu.Lock()
	c, ok := compressors[codec]
	if !ok {
		var cc kgo.CompressionCodec
		switch codec {
		case 1:
			cc = kgo.GzipCompression()
		case 2:
			cc = kgo.SnappyCompression()
		case 3:
			cc = kgo.Lz4Compression()
		case 4:
			cc = kgo.ZstdCompression()
		default:
			compMu.Unlock()
			return nil, fmt.Errorf("unknown compression codec %d", codec)
		}
		var err error
		if c, err = kgo.DefaultCompressor(cc); err != nil {
			compMu.Unlock()
			return nil, err
		}
		compressors[codec] = c
	}
	compMu.Unlock()
	out, used := c.Compress(new(bytes.Buffer), src)
	if used != codec {
		return nil, fmt.Errorf("%s compression failed", codecNames[codec])
	}
	return out, nil // dst is a fresh buffer: out is not shared
}
