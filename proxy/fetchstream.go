package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A Fetch response (v12+: flexible) that no interceptor reads is written to
// the client as it arrives from the broker, its record sets spliced socket
// to socket, instead of being read whole first: a consumer's fetches wait
// for one another, so a response held until its last byte came cost the
// consumer the time its bytes took to arrive twice over (and the proxy a
// buffer of the response's size). Its fields before and between the record
// sets are walked as kmsg decodes them (fetchWalk), so the proxy knows where
// the record sets lie and where the response's own tagged fields start.
//
// Those tagged fields come last and may hold KIP-951 NodeEndpoints (tag 0:
// the brokers that lead partitions that moved), which must reach the client
// as the proxy's endpoints, never the broker's. By then the size prefix is
// written, so the tagged fields are rewritten to the same length
// (sameLengthTags): the endpoints mapped, and padded with one or two unknown
// tagged fields (clients skip unknown tags: KIP-482) when they came out
// shorter by 3 bytes or more; else the NodeEndpoints field is dropped (and
// padded): the client then finds the new leader by a metadata request, as
// before KIP-951.

// padTag and padTag+1 are the numbers of the tagged fields sameLengthTags
// pads with: ones no Fetch response version defines (Kafka's only top-level
// tag is 0, NodeEndpoints, and new ones are numbered in order).
const padTag = 10000

// maxFetchTags bounds the tagged fields at the end of a streamed Fetch
// response, which are read whole to be rewritten.
const maxFetchTags = 1 << 20

// errFetchWalk: a Fetch response whose fields do not read as kmsg decodes
// them, or whose tagged fields cannot be kept at their length. The broker is
// trusted, so this is not expected; part of the response may have reached
// the client already, so the connection is closed.
var errFetchWalk = errors.New("fetch response does not walk")

// fetchWalk reads a Fetch response frame from the broker (ur) and writes it
// to the client as it reads: fields into pend, flushed before each record
// set, which is streamed (spliced) through.
type fetchWalk struct {
	ur   *bufio.Reader // the broker's connection, buffered
	up   io.Reader     // the broker's connection (record sets are spliced from it)
	to   io.Writer     // the client's connection
	left int64         // bytes of the frame not read yet
	pend []byte        // read, not yet written to the client
	err  error         // the first error; every read after it returns zeros
	hold bool          // the tagged fields at the end: held whole, to be rewritten
	// progress, before each write: moves the client's write deadline
	// (conn.setWriteDeadline), so that it bounds a stall between parts,
	// not the whole response; nil: none.
	progress func()
}

// streamFetch writes f's response, a Fetch response frame of 4+size bytes
// whose first bytes are in the upstream reader (answer checked its size and
// correlation id), to the client as it arrives. Errors: reading the broker's
// connection (upstreamReadError), writing the client's, or errFetchWalk.
func (c *conn) streamFetch(f *inflight, size int32) error {
	c.s.m.fetchStreamed.Inc()
	w := &fetchWalk{ur: c.ur, up: c.upstream, to: c.client, left: 4 + int64(size), pend: make([]byte, 0, 512), progress: c.setWriteDeadline}
	tags, err := w.walk(f.version, c.s.mapAddress)
	if tags {
		c.s.m.rewrites.WithLabelValues(apiName(f.key)).Inc()
	}
	return err
}

// walk streams the frame (Fetch version) and reports whether its KIP-951
// endpoints were rewritten (through m).
func (w *fetchWalk) walk(version int16, m AddressMapper) (rewritten bool, err error) {
	w.skip(4 + 4) // size, correlation id
	w.tags()      // the response header's
	w.fetchResponse(version)
	// What is left of the frame is the response's tagged fields: a few
	// endpoints (1 MiB is thousands of brokers).
	if w.err == nil && w.left > maxFetchTags {
		w.fail(fmt.Sprintf("%d bytes of tagged fields", w.left))
	}
	w.flush()
	w.hold = true
	start := len(w.pend)
	w.skip(int(w.left))
	if w.err != nil {
		return false, w.err
	}
	tags, err := sameLengthTags(version, w.pend[start:], m)
	if err != nil {
		return false, err
	}
	if tags != nil {
		w.pend = append(w.pend[:start], tags...)
	}
	w.flush()
	return tags != nil, w.err
}

// upstreamReadError wraps an error reading the broker's connection.
type upstreamReadError struct{ err error }

func (e upstreamReadError) Error() string { return e.err.Error() }
func (e upstreamReadError) Unwrap() error { return e.err }

// take reads the next n bytes of the frame into pend and returns them.
func (w *fetchWalk) take(n int) []byte {
	if w.err != nil {
		return nil
	}
	if n < 0 || int64(n) > w.left {
		w.fail(fmt.Sprintf("a field of %d bytes, %d left in the frame", n, w.left))
		return nil
	}
	start := len(w.pend)
	for need := n; need > 0; {
		k := min(need, readerSize)
		b, err := w.ur.Peek(k)
		if err != nil {
			w.err = upstreamReadError{eofInFrame(err)}
			return nil
		}
		w.pend = append(w.pend, b...)
		_, _ = w.ur.Discard(k)
		need -= k
	}
	w.left -= int64(n)
	out := w.pend[start:]
	if !w.hold && len(w.pend) >= pendFlush {
		w.flush() // (out stays readable: flush keeps pend's array)
	}
	return out
}

// pendFlush is how much of the frame's fields (and small record sets)
// fetchWalk holds before writing them: a response of many small partitions
// is not a write per partition, and a connection holds at most this plus one
// read buffer's worth.
const pendFlush = 16 << 10

// flush writes pend to the client.
func (w *fetchWalk) flush() {
	if w.err != nil || len(w.pend) == 0 {
		return
	}
	if w.progress != nil {
		w.progress()
	}
	if _, err := w.to.Write(w.pend); err != nil {
		w.err = err
	}
	w.pend = w.pend[:0]
}

func (w *fetchWalk) skip(n int) { w.take(n) }

// uvarint reads an unsigned varint (at most 5 bytes, as Kafka's are).
func (w *fetchWalk) uvarint() uint32 {
	var v uint32
	for i := 0; i < 5; i++ {
		b := w.take(1)
		if b == nil {
			return 0
		}
		v |= uint32(b[0]&0x7f) << (7 * i)
		if b[0] < 0x80 {
			return v
		}
	}
	w.fail("varint longer than 5 bytes")
	return 0
}

func (w *fetchWalk) fail(what string) {
	if w.err == nil {
		w.err = fmt.Errorf("%w: %s", errFetchWalk, what)
	}
}

// compactLen reads a compact array's, string's or bytes' length (uvarint
// length + 1; 0 is null: -1).
func (w *fetchWalk) compactLen() int { return int(w.uvarint()) - 1 }

// tags reads a tagged-field section.
func (w *fetchWalk) tags() {
	for n := w.uvarint(); n > 0 && w.err == nil; n-- {
		w.uvarint() // tag
		w.skip(int(w.uvarint()))
	}
}

// fetchResponse walks a Fetch response body (v12+) as kmsg decodes it, up
// to its tagged fields, streaming each record set through.
func (w *fetchWalk) fetchResponse(version int16) {
	w.skip(4 + 2 + 4) // throttle, error code, session id
	topics := w.compactLen()
	for t := 0; t < topics && w.err == nil; t++ {
		if version >= 13 {
			w.skip(16) // topic id
		} else {
			w.skip(max(w.compactLen(), 0)) // topic name
		}
		partitions := w.compactLen()
		for p := 0; p < partitions && w.err == nil; p++ {
			w.skip(4 + 2 + 8 + 8 + 8) // partition, error code, high watermark, last stable offset, log start offset
			aborted := w.compactLen()
			for a := 0; a < aborted && w.err == nil; a++ {
				w.skip(8 + 8) // producer id, first offset
				w.tags()
			}
			w.skip(4) // preferred read replica
			if n := w.compactLen(); n > 0 {
				w.records(n)
			}
			w.tags() // diverging epoch, current leader, snapshot id
		}
		w.tags()
	}
}

// records streams a record set of n bytes from the broker to the client,
// after what was read before it. A set no larger than the read buffer is
// copied with the fields around it instead (written with them once
// pendFlush bytes are held).
func (w *fetchWalk) records(n int) {
	if w.err != nil {
		return
	}
	if int64(n) > w.left {
		w.fail(fmt.Sprintf("a record set of %d bytes, %d left in the frame", n, w.left))
		return
	}
	if n <= readerSize {
		w.skip(n)
		return
	}
	w.flush()
	if w.err != nil {
		return
	}
	progress := w.progress
	if progress == nil {
		progress = func() {}
	}
	// (stream reads the broker and writes the client: a frame the broker
	// cut short is the broker's, any other error ends the connection as
	// a client's, as for a response that streams through whole)
	if err := stream(w.to, w.ur, w.up, int64(n), progress); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = upstreamReadError{err}
		}
		w.err = err
		return
	}
	w.left -= int64(n)
}

// sameLengthTags returns the tagged-field section tags of a Fetch response
// of version rewritten to exactly its length with its KIP-951 NodeEndpoints
// mapped through m (see the comment at the top), or nil when it names no
// broker (it goes as it came). Its other tagged fields are kept. Errors: a
// section that does not decode, or that cannot be kept at its length.
func sameLengthTags(version int16, tags []byte, m AddressMapper) ([]byte, error) {
	if named, err := namesNode(tags); err != nil {
		return nil, fmt.Errorf("%w: its tagged fields: %v", errFetchWalk, err)
	} else if !named {
		return nil, nil
	}
	// A body of no topics with these tagged fields, decoded and encoded
	// by kmsg: throttle, error code, session id and an empty topics array
	// come first, bytes kmsg writes back the same.
	const fixed = 4 + 2 + 4 + 1
	body := make([]byte, fixed, fixed+len(tags))
	body[fixed-1] = 1 // a compact array of no topics
	body = append(body, tags...)
	resp := kmsg.NewPtrFetchResponse()
	resp.SetVersion(version)
	if err := resp.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("%w: its tagged fields: %v", errFetchWalk, err)
	}
	if _, err := rewriteDecoded(resp, m); err != nil {
		resp.Brokers = nil // an endpoint that does not map: none rather than the broker's
	}
	orig := resp.UnknownTags // the broker's other tagged fields, kept
	// encode encodes the section with pad fields of these sizes (tags
	// padTag, padTag+1) after the others.
	encode := func(pads ...int) []byte {
		var t kmsg.Tags
		orig.Each(func(k uint32, v []byte) { t.Set(k, v) })
		for i, n := range pads {
			t.Set(padTag+uint32(i), make([]byte, n))
		}
		resp.UnknownTags = t
		return resp.AppendTo(make([]byte, 0, len(body)+8))[fixed:]
	}
	for range 2 {
		out := encode()
		if gap := len(tags) - len(out); gap == 0 {
			return out, nil
		} else if gap > 0 {
			if out := padTo(len(tags), gap, encode); out != nil {
				return out, nil
			}
		}
		resp.Brokers = nil // longer than they came, or no padding fits: dropped
	}
	return nil, fmt.Errorf("%w: its tagged fields (%d bytes) cannot keep their length without the broker's endpoints", errFetchWalk, len(tags))
}

// namesNode reports whether a tagged-field section holds tag 0 (a Produce or
// Fetch response's NodeEndpoints); errors: a section that does not read to
// its end.
func namesNode(tags []byte) (bool, error) {
	b := kbin.Reader{Src: tags}
	found := false
	for n := b.Uvarint(); n > 0 && b.Ok(); n-- {
		if b.Uvarint() == 0 {
			found = true
		}
		b.Span(int(b.Uvarint()))
	}
	return found, b.Complete()
}

// padTo returns encode's output padded by gap bytes to exactly n, or nil
// when no padding makes it so (a gap of 1 or 2 bytes: a pad field takes 3 at
// least). A pad field is 2 bytes of tag number (padTag), 1 to 5 of length,
// then its zero bytes; the tag count may take a byte more. One field is
// tried first, then an empty one and another (a gap one field cannot make:
// 131 bytes, where a 127-byte pad takes 130 and a 128-byte one 132).
func padTo(n, gap int, encode func(pads ...int) []byte) []byte {
	for _, fields := range []int{1, 2} {
		for lenBytes := 1; lenBytes <= 5; lenBytes++ {
			for count := 0; count <= 1; count++ {
				size := gap - 2 - lenBytes - count
				pads := []int{size}
				if fields == 2 {
					size -= 3
					pads = []int{0, size}
				}
				if size < 0 {
					continue
				}
				if out := encode(pads...); len(out) == n {
					return out
				}
			}
		}
	}
	return nil
}
