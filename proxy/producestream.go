package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/payloadstore"
)

// A Produce request read as it arrives (#19). A record value over
// large.message.stream.threshold.bytes that large-message would offload
// goes from the client's socket to the payload store as it is read
// (ValueStreamer.StreamValue), and its record is written again with the
// reference; every other byte of the frame is kept in an arena charged to
// proxy.memory.max.bytes, as readWhole does. The frame that comes out is a
// Produce request like any other, with small records where the large
// values were, and takes the usual route (handleWhole, interceptProduce):
// the chain finds each streamed value in the request's
// interceptor.Streams and defers it like any offload (committed with its
// batch, deleted when refused, confirmed after the acknowledgement).
//
// What streams: magic v2 batches that are not compressed, of topics whose
// produce chain is large-message alone (Chain.Streamer), in Produce v3+.
// Everything else is kept as it came. The frame's own lengths are checked
// against the bytes left as they are read: a frame whose lengths lie is
// an error (the connection closes, its streamed values are deleted). A
// batch whose records do not parse, or whose CRC-32C does not match, goes
// on with a CRC-32C that does not match: the chain refuses it
// (CORRUPT_MESSAGE), and its values, never committed, are deleted.

// minStreamedFrame is the smallest Produce frame read as it arrives: a
// smaller one cannot hold a value over the smallest stream threshold.
const minStreamedFrame = 1 << 20

// Offsets of the magic v2 batch header (Kafka's DefaultRecordBatch).
const (
	batchHeaderLen   = 61 // up to and with the record count
	batchLenOffset   = 8
	batchMagicOffset = 16
	batchCRCOffset   = 17
	batchAttrOffset  = 21
	batchCountOffset = 57
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// errProduceFrame: a Produce frame whose lengths do not hold together.
var errProduceFrame = errors.New("malformed Produce request")

// produceReader reads one Produce frame (see above).
type produceReader struct {
	env     produceEnv
	h       RequestHeader
	r       *bufio.Reader
	left    int64  // bytes of the frame not read yet
	arena   []byte // the bytes read, except streamed values
	charged int64  // cap(arena) and the frame made of it, charged to env.mem
	fields  []recordsField
	streams *interceptor.Streams
	crc     hash.Hash32 // the running CRC-32C of the batch being read (nil: none)
}

// produceEnv is what a produceReader needs of its connection.
type produceEnv struct {
	ctx      context.Context // the connection's
	mem      *interceptor.Memory
	streamer func(topic string) interceptor.ValueStreamer // nil: the topic's values are read whole
	names    func(id [16]byte) (string, bool)             // Produce v13+ topic ids
	limits   func(topic string) interceptor.TopicLimit
	// deadline sets the client's read deadline (the zero time lifts it);
	// nil: none is set.
	deadline func(time.Time)
}

// recordsField is a partition's records field whose batches were written
// again: arena[prefix:end] is the field as it came (length prefix, then
// content), content its new content.
type recordsField struct {
	prefix, end int
	content     pieces
}

// pieces are bytes to send, in order: ranges of the arena (bytes as they
// came; offsets, since the arena moves as it grows) and bytes written
// again.
type pieces []piece

type piece struct {
	from, to int    // arena[from:to], when b is nil
	b        []byte // bytes written again
}

func (ps pieces) size() int {
	n := 0
	for _, pc := range ps {
		if pc.b != nil {
			n += len(pc.b)
		} else {
			n += pc.to - pc.from
		}
	}
	return n
}

func (ps pieces) appendTo(dst, arena []byte) []byte {
	for _, pc := range ps {
		if pc.b != nil {
			dst = append(dst, pc.b...)
		} else {
			dst = append(dst, arena[pc.from:pc.to]...)
		}
	}
	return dst
}

// readProduce reads a Produce frame of size bytes (after its prefix),
// streaming the values it can. It returns the frame to handle, a release
// for the memory it holds, and the streamed values (nil: none). On error
// the streamed values are deleted.
func (c *conn) readProduce(h RequestHeader, size int32, g *chainGen) ([]byte, func(), *interceptor.Streams, error) {
	env := produceEnv{ctx: c.ctx, mem: c.s.mem, streamer: g.chain.Streamer, names: c.s.ic.topicName,
		limits:   func(topic string) interceptor.TopicLimit { return c.topicLimits(c.ctx, []string{topic})[topic] },
		deadline: c.setReadDeadline}
	return readProduceFrame(c.cr, h, size, env)
}

// readProduceFrame is readProduce reading from r, whose next bytes are the
// frame (size prefix, header h, body).
func readProduceFrame(r *bufio.Reader, h RequestHeader, size int32, env produceEnv) ([]byte, func(), *interceptor.Streams, error) {
	p := &produceReader{env: env, h: h, r: r, left: 4 + int64(size), streams: &interceptor.Streams{}}
	release := func() { env.mem.Give(p.charged); p.charged = 0 }
	err := p.read()
	if err != nil {
		release()
		p.streams.AbortAll(env.ctx)
		return nil, nil, nil, err
	}
	frame, err := p.frame()
	if err != nil {
		release()
		p.streams.AbortAll(env.ctx)
		return nil, nil, nil, err
	}
	if p.streams.Len() == 0 {
		return frame, release, nil, nil
	}
	return frame, release, p.streams, nil
}

// read reads the frame: the size prefix and header, then the body's fields
// (kmsg.ProduceRequest v3+: transactional id, acks, timeout, topics of
// partitions of records), streaming the values it can.
func (p *produceReader) read() error {
	flex := p.h.Flexible
	if _, err := p.take(4 + int64(p.h.Len)); err != nil {
		return err
	}
	if err := p.str(flex); err != nil { // transactional_id
		return err
	}
	if _, err := p.take(2 + 4); err != nil { // acks, timeout_ms
		return err
	}
	topics, err := p.arrayLen(flex)
	if err != nil {
		return err
	}
	for range topics {
		topic := ""
		if p.h.Version >= 13 {
			off, err := p.take(16)
			if err != nil {
				return err
			}
			if name, ok := p.env.names([16]byte(p.arena[off : off+16])); ok {
				topic = name
			}
		} else {
			off := len(p.arena)
			if err := p.str(flex); err != nil {
				return err
			}
			topic = p.strAt(off, flex)
		}
		var vs interceptor.ValueStreamer
		if topic != "" && p.env.streamer != nil {
			vs = p.env.streamer(topic)
		}
		partitions, err := p.arrayLen(flex)
		if err != nil {
			return err
		}
		for range partitions {
			if _, err := p.take(4); err != nil { // partition
				return err
			}
			if err := p.records(topic, vs, flex); err != nil {
				return err
			}
			if err := p.tags(flex); err != nil {
				return err
			}
		}
		if err := p.tags(flex); err != nil {
			return err
		}
	}
	if err := p.tags(flex); err != nil {
		return err
	}
	if p.left != 0 {
		return fmt.Errorf("%w: %d bytes after its last field", errProduceFrame, p.left)
	}
	return nil
}

// records reads a partition's records field: as it is, unless vs may
// stream values of its batches.
func (p *produceReader) records(topic string, vs interceptor.ValueStreamer, flex bool) error {
	prefix := len(p.arena)
	n, err := p.length(flex, 4)
	if err != nil {
		return err
	}
	if n <= 0 { // null or empty
		return nil
	}
	if n > p.left {
		return fmt.Errorf("%w: topic %s: a records field of %d bytes, %d left in the frame", errProduceFrame, topic, n, p.left)
	}
	if vs == nil || n < vs.StreamThreshold() {
		_, err := p.take(n)
		return err
	}
	lim := p.env.limits(topic)
	f := recordsField{prefix: prefix}
	start := len(p.arena)
	rewritten := false
	for n > 0 {
		batchStart := len(p.arena)
		out, used, err := p.batch(topic, vs, lim, n)
		if err != nil {
			return err
		}
		n -= used
		if out != nil {
			rewritten = true
			f.content = append(f.content, piece{from: start, to: batchStart}, piece{b: out})
			start = len(p.arena)
		}
	}
	if rewritten {
		f.content = append(f.content, piece{from: start, to: len(p.arena)})
		f.end = len(p.arena)
		p.fields = append(p.fields, f)
	}
	return nil
}

// batch reads one batch of at most rest bytes. It returns the batch
// written again when it streamed a value (nil: the arena holds it as it
// came) and the bytes of the field it used.
func (p *produceReader) batch(topic string, vs interceptor.ValueStreamer, lim interceptor.TopicLimit, rest int64) (out []byte, used int64, err error) {
	if rest < batchHeaderLen {
		_, err := p.take(rest)
		return nil, rest, err
	}
	off, err := p.take(batchHeaderLen)
	if err != nil {
		return nil, 0, err
	}
	var hdr [batchHeaderLen]byte
	copy(hdr[:], p.arena[off:])
	total := 12 + int64(int32(binary.BigEndian.Uint32(hdr[batchLenOffset:])))
	attrs := binary.BigEndian.Uint16(hdr[batchAttrOffset:])
	if total < batchHeaderLen || total > rest || hdr[batchMagicOffset] != 2 || attrs&0x7 != 0 || total-batchHeaderLen < vs.StreamThreshold() {
		// Not one to stream (compressed, another magic, too small) or
		// not a batch at all: kept as it came, for the chain (or the
		// broker) to judge.
		if total < batchHeaderLen || total > rest {
			total = rest
		}
		_, err := p.take(total - batchHeaderLen)
		return nil, total, err
	}
	b := &batchReader{p: p, topic: topic, vs: vs, lim: lim, left: total - batchHeaderLen,
		count: int32(binary.BigEndian.Uint32(hdr[batchCountOffset:])), segStart: len(p.arena)}
	p.crc = crc32.New(crc32c)
	p.crc.Write(hdr[batchAttrOffset:])
	defer func() { p.crc = nil }()
	corrupt, err := b.read()
	if err != nil {
		return nil, 0, err
	}
	if !b.streamed {
		return nil, total, nil
	}
	corrupt = corrupt || p.crc.Sum32() != binary.BigEndian.Uint32(hdr[batchCRCOffset:])
	return b.rewrite(hdr, corrupt), total, nil
}

// batchReader reads the records of one uncompressed batch.
type batchReader struct {
	p        *produceReader
	topic    string
	vs       interceptor.ValueStreamer
	lim      interceptor.TopicLimit
	left     int64 // bytes of the batch's records not read yet
	count    int32
	streamed bool   // a value went to the store
	records  pieces // the records as they are to be sent, up to segStart
	segStart int    // arena offset where the records not yet in records start
}

// read reads the batch's records. corrupt: they do not parse, or do not
// fill the batch as its header says (what is left of it was read as it
// is, so that the frame stays in step).
func (b *batchReader) read() (corrupt bool, err error) {
	read := int32(0)
	for ; read < b.count && b.left > 0; read++ {
		ok, err := b.record()
		if err != nil {
			return false, err
		}
		if !ok {
			corrupt = true
			break
		}
	}
	if read != b.count || b.left != 0 {
		corrupt = true
	}
	if b.left > 0 {
		if _, err := b.p.take(b.left); err != nil {
			return false, err
		}
		b.left = 0
	}
	return corrupt, nil
}

// record reads one record; false: it does not parse (the batch is corrupt,
// what is left of it still to read).
func (b *batchReader) record() (bool, error) {
	p := b.p
	recOff := len(p.arena)
	rl, err := b.varint()
	if err != nil || rl < 0 || int64(rl) > b.left {
		return false, err
	}
	end := b.left - int64(rl) // b.left once the record is read
	bodyOff := len(p.arena)
	if _, err := b.take(1); err != nil { // attributes
		return false, err
	}
	tsOff := len(p.arena)
	if err := b.skipVarlong(); err != nil { // timestamp delta
		return false, err
	}
	tsLen := len(p.arena) - tsOff
	offOff := len(p.arena)
	if _, err := b.varint(); err != nil { // offset delta
		return false, err
	}
	offLen := len(p.arena) - offOff
	kl, err := b.varint()
	if err != nil || int64(kl) > b.left-end {
		return false, err
	}
	if kl > 0 {
		if _, err := b.take(int64(kl)); err != nil {
			return false, err
		}
	}
	keyEnd := len(p.arena)
	vl, err := b.varint()
	if err != nil || int64(vl) > b.left-end {
		return false, err
	}
	var sv *interceptor.StreamedValue
	if int64(vl) > b.vs.StreamThreshold() && b.vs.Offloads(b.lim, recordLen(int64(rl), tsLen, offLen)) {
		if sv, err = b.stream(int64(vl)); err != nil {
			return false, err
		}
	} else if vl > 0 {
		if _, err := b.take(int64(vl)); err != nil {
			return false, err
		}
	}
	hdrOff := len(p.arena)
	hc, err := b.varint()
	if err != nil || hc < 0 || int64(hc) > b.left-end {
		return false, err
	}
	for range hc {
		for range 2 { // key, value
			n, err := b.varint()
			if err != nil || int64(n) > b.left-end {
				return false, err
			}
			if n > 0 {
				if _, err := b.take(int64(n)); err != nil {
					return false, err
				}
			}
		}
	}
	if b.left != end {
		return false, nil // the record's length lies
	}
	if sv == nil {
		return true, nil
	}
	// The record again, with the reference and its headers.
	own, err := parseHeaders(p.arena[hdrOff:])
	if err != nil {
		return false, nil
	}
	body := append([]byte(nil), p.arena[bodyOff:keyEnd]...) // attributes, deltas, key
	body = kbin.AppendVarint(body, int32(len(sv.Value)))
	body = append(body, sv.Value...)
	hs := sv.RecordHeaders(own)
	body = kbin.AppendVarint(body, int32(len(hs)))
	for _, h := range hs {
		body = kbin.AppendVarint(body, int32(len(h.Key)))
		body = append(body, h.Key...)
		if h.Value == nil {
			body = kbin.AppendVarint(body, -1)
		} else {
			body = kbin.AppendVarint(body, int32(len(h.Value)))
			body = append(body, h.Value...)
		}
	}
	rec := kbin.AppendVarint(make([]byte, 0, len(body)+5), int32(len(body)))
	rec = append(rec, body...)
	b.records = append(b.records, piece{from: b.segStart, to: recOff}, piece{b: rec})
	b.segStart = len(p.arena)
	return true, nil
}

// recordLen is largemessage.RecordLen of a record whose body is rl bytes
// with timestamp and offset deltas of tsLen and offLen bytes (RecordLen
// counts them as zero, one byte each).
func recordLen(rl int64, tsLen, offLen int) int64 {
	n := rl - int64(tsLen) - int64(offLen) + 2
	return int64(kbin.VarintLen(int32(n))) + n
}

// stream publishes the next n bytes of the frame, a record value, through
// the batch's ValueStreamer. A store failure leaves a value that fails its
// partition (the rest of the value is read and dropped); a client that
// goes away, or sends nothing for the streamer's StallTimeout, ends the
// connection (and the upload: nothing is left in the store).
func (b *batchReader) stream(n int64) (*interceptor.StreamedValue, error) {
	p := b.p
	// The upload's buffers come from the memory budget: it bounds how
	// many values stream at once.
	if err := p.takeMem(payloadstore.ReadOnceUploadBytes); err != nil {
		return nil, err
	}
	defer p.env.mem.Give(payloadstore.ReadOnceUploadBytes)
	body := &socketBody{deadline: p.env.deadline, r: io.LimitReader(p.r, n), crc: p.crc, stall: b.vs.StallTimeout()}
	defer body.done()
	sv, err := b.vs.StreamValue(p.env.ctx, b.topic, body, n)
	if err != nil && body.err == nil && body.n < n {
		// The store failed: the rest of the value is read and dropped.
		_, _ = io.Copy(io.Discard, body)
	}
	b.left -= n
	p.left -= n
	b.streamed = true
	if body.err != nil || body.n != n {
		return nil, fmt.Errorf("topic %s: streaming a %d-byte value (%d bytes read): %w", b.topic, n, body.n, eofInFrame(cmpErr(body.err, io.ErrUnexpectedEOF)))
	}
	if err != nil {
		sv = interceptor.FailedStream(b.topic, err)
	}
	p.streams.Add(sv)
	return sv, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// socketBody is a value read from the client: it counts and checksums
// (the batch's CRC-32C) what it reads, keeps the socket's error, and
// bounds the wait for each read by stall (a read deadline, moved on as
// bytes arrive).
type socketBody struct {
	deadline func(time.Time) // nil: none is set
	r        io.Reader
	crc      hash.Hash32
	stall    time.Duration
	until    time.Time // the read deadline set, zero: none
	n        int64
	err      error
}

func (s *socketBody) Read(b []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if now := time.Now(); s.deadline != nil && s.stall > 0 && s.until.Sub(now) < s.stall*3/4 {
		s.until = now.Add(s.stall)
		s.deadline(s.until)
	}
	n, err := s.r.Read(b)
	s.crc.Write(b[:n])
	s.n += int64(n)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// done lifts the read deadline.
func (s *socketBody) done() {
	if !s.until.IsZero() {
		s.deadline(time.Time{})
	}
}

// rewrite returns the batch with its records as b.records say: the header
// as it came with a new length and CRC-32C (one that does not match when
// corrupt).
func (b *batchReader) rewrite(hdr [batchHeaderLen]byte, corrupt bool) []byte {
	recs := append(b.records, piece{from: b.segStart, to: len(b.p.arena)})
	out := make([]byte, 0, batchHeaderLen+recs.size())
	out = append(out, hdr[:]...)
	out = recs.appendTo(out, b.p.arena)
	binary.BigEndian.PutUint32(out[batchLenOffset:], uint32(len(out)-12))
	crc := crc32.Checksum(out[batchAttrOffset:], crc32c)
	if corrupt {
		crc = ^crc
	}
	binary.BigEndian.PutUint32(out[batchCRCOffset:], crc)
	return out
}

func (b *batchReader) take(n int64) (int, error) {
	if n > b.left {
		return 0, fmt.Errorf("%w: a record runs past its batch", errProduceFrame)
	}
	off, err := b.p.take(n)
	if err == nil {
		b.left -= n
	}
	return off, err
}

// varint reads a zig-zag varint of the batch's records.
func (b *batchReader) varint() (int32, error) {
	start := len(b.p.arena)
	u, err := b.p.uvarintMax(5, b.left)
	b.left -= int64(len(b.p.arena) - start)
	return int32(u>>1) ^ -int32(u&1), err
}

// skipVarlong reads past a zig-zag varlong of the batch's records (a
// record's timestamp delta: up to 10 bytes in Kafka's DefaultRecord; a
// batch spanning more than about 199 days needs 6).
func (b *batchReader) skipVarlong() error {
	start := len(b.p.arena)
	_, err := b.p.uvarintMax(10, b.left)
	b.left -= int64(len(b.p.arena) - start)
	return err
}

// parseHeaders decodes a record's headers (count, then key and value of
// each), as record() has already checked them.
func parseHeaders(src []byte) ([]interceptor.Header, error) {
	r := kbin.Reader{Src: src}
	n := r.Varint()
	if n < 0 {
		return nil, errProduceFrame
	}
	hs := make([]interceptor.Header, 0, n)
	for range n {
		k := r.VarintString()
		v := r.VarintBytes()
		// bytes.Clone keeps an empty value empty and a null one null.
		hs = append(hs, interceptor.Header{Key: k, Value: bytes.Clone(v)})
	}
	return hs, r.Complete()
}

// frame returns the frame to handle: the arena when nothing was streamed,
// else the arena with each rewritten records field in place (a new length
// prefix, then its pieces) and a new size prefix.
func (p *produceReader) frame() ([]byte, error) {
	if len(p.fields) == 0 {
		return p.arena, nil
	}
	n := len(p.arena)
	for _, f := range p.fields {
		n += 5 + f.content.size() - (f.end - f.prefix)
	}
	if err := p.takeMem(int64(n)); err != nil {
		return nil, err
	}
	p.charged += int64(n)
	out := make([]byte, 0, n)
	prev := 0
	for _, f := range p.fields {
		out = append(out, p.arena[prev:f.prefix]...)
		if p.h.Flexible {
			out = kbin.AppendUvarint(out, uint32(f.content.size()+1))
		} else {
			out = kbin.AppendInt32(out, int32(f.content.size()))
		}
		out = f.content.appendTo(out, p.arena)
		prev = f.end
	}
	out = append(out, p.arena[prev:]...)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	// The arena is no longer needed: only out is handled.
	p.env.mem.Give(int64(cap(p.arena)))
	p.charged -= int64(cap(p.arena))
	p.arena = nil
	return out, nil
}

// take reads n bytes of the frame into the arena, which grows (charged to
// the memory budget first) with what arrives: a client that stalls holds
// only what it sent. It returns their offset in the arena.
func (p *produceReader) take(n int64) (int, error) {
	if n < 0 || n > p.left {
		return 0, fmt.Errorf("%w: a length of %d bytes, %d left in the frame", errProduceFrame, n, p.left)
	}
	start := len(p.arena)
	for need := int(n); need > 0; {
		if len(p.arena) == cap(p.arena) {
			// Geometric growth (a frame of many small fields must not
			// copy its arena on every field), never past what the frame
			// has left. A field larger than the step (a records field
			// kept as it came) gets room for up to frameStep of the
			// fields after it as well: the few bytes that end the frame
			// must not copy it again, holding it twice.
			by := int(min(int64(max(cap(p.arena), frameStep)), p.left))
			if need >= by {
				by = need + int(min(frameStep, p.left-n))
			}
			if err := p.grow(by); err != nil {
				return 0, err
			}
		}
		chunk := p.arena[len(p.arena):min(cap(p.arena), len(p.arena)+need)]
		m, err := io.ReadFull(p.r, chunk)
		p.arena = p.arena[:len(p.arena)+m]
		need -= m
		if err != nil {
			return 0, eofInFrame(err)
		}
	}
	p.left -= n
	if p.crc != nil {
		p.crc.Write(p.arena[start:])
	}
	return start, nil
}

// grow makes room for by more bytes in the arena.
func (p *produceReader) grow(by int) error {
	newCap := cap(p.arena) + by
	if err := p.takeMem(int64(newCap)); err != nil {
		return err
	}
	nb := make([]byte, len(p.arena), newCap)
	copy(nb, p.arena)
	p.env.mem.Give(int64(cap(p.arena)))
	p.charged += int64(newCap - cap(p.arena))
	p.arena = nb
	return nil
}

// takeMem takes n more bytes of the memory budget for the frame, which
// holds p.charged already: it fails at once (interceptor.ErrMemoryBusy)
// when the two exceed proxy.memory.max.bytes, since the frame would wait
// for bytes that it holds itself and never get them (TakeUnqueued waits
// until the connection ends).
func (p *produceReader) takeMem(n int64) error {
	if lim := p.env.mem.Limit(); p.charged+n > lim {
		return fmt.Errorf("%w: a Produce request streaming values needs %d bytes more of proxy.memory.max.bytes while it holds %d, the budget is %d",
			interceptor.ErrMemoryBusy, n, p.charged, lim)
	}
	return p.env.mem.TakeUnqueued(p.env.ctx, n)
}

// uvarint reads an unsigned varint of the request's fields.
func (p *produceReader) uvarint() (uint32, error) { return p.uvarintMax(5, p.left) }

// uvarintMax reads an unsigned varint of at most max bytes and at most
// limit bytes; the value returned is its low 32 bits (a varlong is read
// only to be passed over).
func (p *produceReader) uvarintMax(max int, limit int64) (uint32, error) {
	var u uint32
	for i := 0; i < max; i++ {
		if int64(i) >= limit {
			break
		}
		off, err := p.take(1)
		if err != nil {
			return 0, err
		}
		c := p.arena[off]
		u |= uint32(c&0x7f) << (7 * i)
		if c < 0x80 {
			return u, nil
		}
	}
	return 0, fmt.Errorf("%w: a malformed varint", errProduceFrame)
}

// length reads a length prefix: a compact one (uvarint, less 1; -1 for
// null) when flex, else a signed big-endian int of width 2 or 4 bytes.
func (p *produceReader) length(flex bool, width int64) (int64, error) {
	if flex {
		u, err := p.uvarint()
		if err != nil {
			return 0, err
		}
		return int64(u) - 1, nil
	}
	off, err := p.take(width)
	if err != nil {
		return 0, err
	}
	if width == 2 {
		return int64(int16(binary.BigEndian.Uint16(p.arena[off:]))), nil
	}
	return int64(int32(binary.BigEndian.Uint32(p.arena[off:]))), nil
}

// arrayLen reads an array's length (0 for null).
func (p *produceReader) arrayLen(flex bool) (int, error) {
	n, err := p.length(flex, 4)
	if err != nil {
		return 0, err
	}
	if n > p.left {
		return 0, fmt.Errorf("%w: an array of %d elements, %d bytes left", errProduceFrame, n, p.left)
	}
	return int(max(n, 0)), nil
}

// str reads a (nullable, compact when flex) string.
func (p *produceReader) str(flex bool) error {
	n, err := p.length(flex, 2)
	if err != nil {
		return err
	}
	if n <= 0 {
		return nil
	}
	_, err = p.take(n)
	return err
}

// strAt decodes the string str read at arena offset off.
func (p *produceReader) strAt(off int, flex bool) string {
	r := kbin.Reader{Src: p.arena[off:]}
	var s *string
	if flex {
		s = r.CompactNullableString()
	} else {
		s = r.NullableString()
	}
	if s == nil || !r.Ok() {
		return ""
	}
	return *s
}

// tags reads tagged fields (flexible versions).
func (p *produceReader) tags(flex bool) error {
	if !flex {
		return nil
	}
	n, err := p.uvarint()
	if err != nil {
		return err
	}
	for range n {
		if _, err := p.uvarint(); err != nil {
			return err
		}
		size, err := p.uvarint()
		if err != nil {
			return err
		}
		if _, err := p.take(int64(size)); err != nil {
			return err
		}
	}
	return nil
}
