package interceptor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/ferrykit/ferry/internal/crc32c"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Streamed values (issue 19). On fetch, large-message does not download a
// payload larger than large.message.stream.threshold.bytes whose record
// carries its CRC-32C (ferry.payload.crc32c): it opens the download (so a
// missing object still fails the partition, or is skipped, before the
// response is committed) and leaves the value as a hole. The batch holding
// it is encoded around the hole: the record's length varint and the
// batch's length count the payload, and the batch's CRC-32C is combined
// from the CRC of the bytes before the hole, the payload's CRC and the
// bytes after it (internal/crc32c). Such a batch goes out uncompressed:
// its length must be known before the payload is read. The proxy writes
// the frame as a vector and fills each hole from its download as it is
// read (Hole.Stream), checking size, SHA-256 and CRC-32C on the way; the
// last chunk is held back until they match, so a client never receives a
// complete frame with a bad payload.

// StreamReadAhead bounds the bytes a streamed value's download holds ahead
// of the client (payloadstore.WithStreaming): 16 MiB, fetched as four ranged
// GETs of 4 MiB from a cloud store.
const StreamReadAhead = 16 << 20

// streamChunk is the size of each of the two buffers a Hole is written
// through (one being filled while the one before it is held back).
const streamChunk = 512 << 10

// maxStreamSize is the largest value streamed: a record's length is an
// int32 varint.
const maxStreamSize = 1<<31 - 1<<20

// ErrStreamedPayload: a streamed value failed while it was being written
// to the client (its size, SHA-256 or CRC-32C did not match, or the store
// failed mid-stream). The client's connection must be closed: it holds
// part of a frame that can never be completed.
var ErrStreamedPayload = errors.New("a streamed payload failed after its response was committed")

// valueStream is a record's value left as a hole: its verified download.
type valueStream struct {
	rc   io.ReadCloser // checks size and SHA-256 (largemessage.Deserializer.OpenValue)
	size int64
	crc  uint32
	once sync.Once
	stop func() // cancels the download's context
	// corrupt, when set, is told that the payload did not match the
	// record's size, SHA-256 or CRC-32C header as the store served it
	// (never for a download that failed): the next fetch of the record is then
	// answered CORRUPT_MESSAGE before anything is committed
	// (LargeMessage.corrupt), where it would be cut mid-stream again.
	corrupt func(error)
}

func (s *valueStream) Close() error {
	s.once.Do(func() {
		s.rc.Close()
		s.stop()
	})
	return nil
}

// Hole is a streamed value's place in a partition's rewritten record set.
type Hole struct {
	// At is the offset in the partition's record set (RecordBatches, as the
	// chain left it, without the payloads) where the value's bytes go.
	At int64
	// Size is the value's length in bytes.
	Size int64
	// Topic, Partition and Offset name the record, for logs.
	Topic     string
	Partition int32
	Offset    int64
	s         *valueStream
}

// StreamedSet is a partition whose record set holds holes, in order.
type StreamedSet struct {
	Partition *kmsg.FetchResponseTopicPartition
	Holes     []*Hole
}

// Len is the record set's length with its payloads.
func (s StreamedSet) Len() int64 {
	n := int64(len(s.Partition.RecordBatches))
	for _, h := range s.Holes {
		n += h.Size
	}
	return n
}

// Close stops the hole's download (it is safe more than once; the
// FetchOutcome's Release closes every hole).
func (h *Hole) Close() error { return h.s.Close() }

var chunkPool = sync.Pool{New: func() any { b := make([]byte, streamChunk); return &b }}

// Stream writes the hole's payload to w as it is read from the store,
// checking its size, SHA-256 and CRC-32C. A chunk is written only once the
// next one has been read, and the last one only when every check passed:
// on an error (ErrStreamedPayload wrapping the cause, a
// *largemessage.RecordError, or w's own) at least that chunk never reaches
// w. It closes the download.
func (h *Hole) Stream(w io.Writer) (int64, error) {
	defer h.Close()
	bp1, bp2 := chunkPool.Get().(*[]byte), chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp1)
	defer chunkPool.Put(bp2)
	cur, held := *bp1, (*bp2)[:0]
	var crc uint32
	var n, written int64
	for {
		k, err := io.ReadFull(h.s.rc, cur)
		n += int64(k)
		crc = crc32c.Update(crc, cur[:k])
		end := err == io.EOF || err == io.ErrUnexpectedEOF
		if err != nil && !end {
			var re *largemessage.RecordError
			if errors.As(err, &re) { // it names the record
				if (errors.Is(err, largemessage.ErrDigestMismatch) || errors.Is(err, largemessage.ErrSizeMismatch)) && h.s.corrupt != nil {
					// The store said where the object ends (a failed
					// download is a download error): not the record's bytes.
					h.s.corrupt(err)
				}
				return written, fmt.Errorf("%w: %w", ErrStreamedPayload, err)
			}
			return written, fmt.Errorf("%w: topic %s partition %d offset %d: %w", ErrStreamedPayload, h.Topic, h.Partition, h.Offset, err)
		}
		if n > h.Size || end && n != h.Size {
			return written, fmt.Errorf("%w: topic %s partition %d offset %d: %d bytes, the size header says %d", ErrStreamedPayload, h.Topic, h.Partition, h.Offset, n, h.Size)
		}
		if end && crc != h.s.crc {
			err := fmt.Errorf("%w: topic %s partition %d offset %d: the payload's CRC-32C is %08x, its ferry.payload.crc32c header says %08x", ErrStreamedPayload, h.Topic, h.Partition, h.Offset, crc, h.s.crc)
			if h.s.corrupt != nil {
				h.s.corrupt(err) // its size and SHA-256 matched: the headers disagree
			}
			return written, err
		}
		if len(held) > 0 {
			m, werr := w.Write(held)
			written += int64(m)
			if werr != nil {
				return written, werr
			}
		}
		if end {
			m, werr := w.Write(cur[:k])
			written += int64(m)
			return written, werr
		}
		held, cur = cur[:k], held[:cap(held)]
	}
}

// closers: streams a ledger's work opened, closed when it is released
// (after the response is written, or when the work is dropped).
func (l *ledger) addCloser(c io.Closer) {
	if l != nil {
		l.closers = append(l.closers, c)
	}
}

// holeRec is a kept record (d.recs index) whose value is a hole.
type holeRec struct {
	rec int
	s   *valueStream
}

// streamedWireLen is the length of kr in a records section with its value
// (currently the empty placeholder) size bytes long.
func streamedWireLen(kr *kmsg.Record, size int64) int64 {
	body := int64(recordBodyLen(kr)-varintBytesLen(kr.Value)) + int64(kbin.VarintLen(int32(size))) + size
	return int64(kbin.VarintLen(int32(body))) + body
}

// encodeStreamed is encode for a batch with holes (d.holes): the records
// are written uncompressed with each hole's value left out (its length
// written), the batch's length counts the holes and its CRC-32C is
// combined around them. It returns the batch (after d.headroom bytes) and
// its holes, At relative to the batch's first byte.
func (d *decodedBatch) encodeStreamed(ctx context.Context, l *ledger, topic string, partition int32) ([]byte, []*Hole, error) {
	holeOf := make(map[int]*valueStream, len(d.holes))
	for _, h := range d.holes {
		holeOf[h.rec] = h.s
	}
	size := int64(batchHeaderLen + d.headroom)
	for i := range d.recs {
		if raw := d.rawOf(i); raw != nil {
			size += int64(len(raw))
		} else if s := holeOf[i]; s != nil {
			size += streamedWireLen(&d.recs[i], s.size) - s.size
		} else {
			size += recordWireLen(&d.recs[i])
		}
	}
	// The two write chunks the holes are streamed through (Hole.Stream;
	// one pair at a time per response) are charged once per ledger, with
	// its first streamed batch, and held until the response is written.
	chunks := l != nil && !l.chunks
	if chunks {
		size += 2 * streamChunk
	}
	if err := l.charge(ctx, size); err != nil {
		return nil, nil, err
	}
	if chunks {
		size -= 2 * streamChunk
		l.chunks = true
	}
	room := d.headroom
	buf := make([]byte, room+batchHeaderLen, size)
	var holes []*Hole
	var holeBytes int64
	var tmp []byte
	for i := range d.recs {
		if raw := d.rawOf(i); raw != nil {
			buf = append(buf, raw...)
			continue
		}
		r := &d.recs[i]
		s := holeOf[i]
		if s == nil {
			start := len(buf)
			r.Length = int32(recordBodyLen(r))
			buf = r.AppendTo(buf)
			if len(buf)-start != int(recordWireLen(r)) {
				buf = buf[:start]
				r.Length = 0
				tmp = r.AppendTo(tmp[:0])
				r.Length = int32(len(tmp) - 1)
				buf = kbin.AppendVarint(buf, r.Length)
				buf = append(buf, tmp[1:]...)
			}
			continue
		}
		// The record encoded with a null value (one byte, varint -1),
		// then split at that byte: what comes before the value and what
		// comes after it (the headers).
		r.Length, r.Value = 0, nil
		tmp = r.AppendTo(tmp[:0])
		body := tmp[1:] // after the zero length
		pre := 1 + kbin.VarlongLen(tsDelta(r)) + kbin.VarintLen(r.OffsetDelta) + varintBytesLen(r.Key)
		if pre >= len(body) || body[pre] != 1 {
			return nil, nil, fmt.Errorf("streamed record at offset delta %d: its encoding has no null value where expected", r.OffsetDelta)
		}
		prefix, suffix := body[:pre], body[pre+1:]
		n := int64(len(prefix)+kbin.VarintLen(int32(s.size))+len(suffix)) + s.size
		buf = kbin.AppendVarint(buf, int32(n))
		buf = append(buf, prefix...)
		buf = kbin.AppendVarint(buf, int32(s.size))
		holes = append(holes, &Hole{At: int64(len(buf) - room), Size: s.size, Topic: topic, Partition: partition,
			Offset: d.hdr.FirstOffset + int64(r.OffsetDelta), s: s})
		holeBytes += s.size
		buf = append(buf, suffix...)
	}
	recs := buf[room+batchHeaderLen:]
	h := d.hdr
	h.Attributes &^= attrCodecMask // the frame's length is known before the payload is read
	h.Records = recs
	h.NumRecords = int32(len(d.recs))
	h.Length = int32(int64(batchHeaderLen-lengthOffset-4+len(recs)) + holeBytes)
	h.CRC = 0
	out := h.AppendTo(buf[room:room])
	var crc uint32
	prev := int64(attrOffset)
	for _, hl := range holes {
		crc = crc32c.Update(crc, out[prev:hl.At])
		crc = crc32c.Combine(crc, hl.s.crc, hl.Size)
		prev = hl.At
	}
	crc = crc32c.Update(crc, out[prev:])
	binary.BigEndian.PutUint32(out[crcOffset:], crc)
	return buf[:room+len(out)], holes, nil
}

// tsDelta is the timestamp delta kmsg writes for r.
func tsDelta(r *kmsg.Record) int64 {
	if r.TimestampDelta64 != 0 {
		return r.TimestampDelta64
	}
	return int64(r.TimestampDelta)
}

// streamable reports whether topic's last fetch interceptor (the one that
// sees records last) is large-message's fetch side, and none works on
// whole batches: only then may a value stay a hole, since no interceptor
// after it would read the value.
func (c *Chain) streamable(topic string) bool {
	last := -1
	for i, ic := range c.fetch {
		if ic.TopicPattern().MatchString(topic) {
			if batchOf(ic) != nil {
				return false
			}
			last = i
		}
	}
	if last < 0 {
		return false
	}
	_, ok := c.fetch[last].(fetchSide)
	return ok
}
