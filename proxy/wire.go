package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultMaxRequestBytes is Kafka's default socket.request.max.bytes
// (100 MiB): the largest request frame, size prefix excluded, the proxy
// reads from a client.
const DefaultMaxRequestBytes = 104857600

// DefaultMaxResponseBytes bounds a response frame read from a broker
// (1 GiB). Kafka has no such broker setting; clients cap what they read
// (franz-go: BrokerMaxReadBytes, 100 MiB by default).
const DefaultMaxResponseBytes = 1 << 30

// apiVersionsKey is ApiVersions' API key: its response header is never
// flexible (KIP-511), so a client can read the answer before it knows the
// versions.
const apiVersionsKey = 18

// ErrFrameTooLarge is returned by ReadFrame for a size prefix above the
// limit. The broker closes the connection without an answer in that case
// (socket.request.max.bytes), and so does the proxy.
var ErrFrameTooLarge = errors.New("frame size prefix over the limit")

// ErrNegativeSize is returned by ReadFrame for a negative size prefix.
var ErrNegativeSize = errors.New("negative frame size prefix")

// ReadFrame reads one Kafka frame: a big-endian int32 size followed by that
// many bytes. It returns the whole frame, size prefix included (so it can be
// forwarded with one write); the message is frame[4:].
//
// Errors: io.EOF when r ends before the first byte of a frame,
// io.ErrUnexpectedEOF when it ends inside one, ErrFrameTooLarge when the size
// is above max (nothing past the prefix is read), ErrNegativeSize, or r's
// error. The buffer grows with the bytes that arrive: a size prefix alone
// never makes it allocate the size it claims.
func ReadFrame(r *bufio.Reader, max int32) ([]byte, error) {
	return readFrame(r, max, nil)
}

// peekSize returns the size prefix of the next frame of r, checked against
// max, without consuming it.
func peekSize(r *bufio.Reader, max int32) (int32, error) {
	head, err := r.Peek(4)
	if err != nil {
		if errors.Is(err, io.EOF) && len(head) > 0 {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, err
	}
	size := int32(binary.BigEndian.Uint32(head))
	if size < 0 {
		return 0, fmt.Errorf("%w: %d", ErrNegativeSize, size)
	}
	if size > max {
		return 0, fmt.Errorf("%w: %d bytes > %d", ErrFrameTooLarge, size, max)
	}
	return size, nil
}

// frameStep is the first allocation of a frame read whole; the buffer
// doubles as bytes arrive.
const frameStep = 64 << 10

// readFrame is ReadFrame reading into buf when it is large enough.
func readFrame(r *bufio.Reader, max int32, buf []byte) ([]byte, error) {
	size, err := peekSize(r, max)
	if err != nil {
		return nil, err
	}
	n := 4 + int(size)
	if cap(buf) >= n {
		frame := buf[:n]
		if _, err := io.ReadFull(r, frame); err != nil {
			return nil, eofInFrame(err)
		}
		return frame, nil
	}
	return readFrameCharged(r, max, 0, nil, nil)
}

// readFrameCharged is ReadFrame calling charge(n) before each growth of
// its buffer to n bytes, and give(old) once the old buffer is copied (nil:
// no charge): the charge follows the real peak. charge's error ends the
// read; what was charged stays charged (the caller gives it back). held,
// when over 0, is what the charge may reach at once (the memory budget's
// size): a growth holds the old buffer and the new one, so the buffer
// grows to the whole frame at once when the growth after the next one
// would pass held; a frame of at most held bytes is then always read.
func readFrameCharged(r *bufio.Reader, max int32, held int64, charge func(int64) error, give func(int64)) ([]byte, error) {
	size, err := peekSize(r, max)
	if err != nil {
		return nil, err
	}
	n := 4 + int(size)
	grow := func(frame []byte, by int) ([]byte, error) {
		newCap := cap(frame) + by
		if charge != nil {
			if err := charge(int64(newCap)); err != nil {
				return nil, err
			}
		}
		nb := make([]byte, len(frame), newCap)
		copy(nb, frame)
		if give != nil {
			give(int64(cap(frame)))
		}
		return nb, nil
	}
	// next is the capacity after c: doubled, or the whole frame.
	next := func(c int) int {
		nc := min(n, 2*c)
		if c == 0 {
			nc = min(n, frameStep)
		}
		if held > 0 && nc < n && int64(nc)+int64(n) > held {
			nc = n
		}
		return nc
	}
	frame, err := grow(nil, next(0))
	if err != nil {
		return nil, err
	}
	for len(frame) < n {
		if len(frame) == cap(frame) {
			if frame, err = grow(frame, next(cap(frame))-cap(frame)); err != nil {
				return nil, err
			}
		}
		m, err := r.Read(frame[len(frame):min(n, cap(frame))])
		frame = frame[:len(frame)+m]
		if err != nil && len(frame) < n {
			return nil, eofInFrame(err)
		}
	}
	return frame, nil
}

func eofInFrame(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// RequestHeader is the part of a request the proxy decodes: request header
// v1 (api key, version, correlation id, client id) or v2 (the same plus
// tagged fields) for flexible versions (KIP-482).
type RequestHeader struct {
	Key           int16
	Version       int16
	CorrelationID int32
	ClientID      *string
	// Flexible reports a v2 header (request and response header carry
	// tagged fields).
	Flexible bool
	// Len is the header's length in bytes; the request body starts there.
	Len int
}

// Errors of ParseRequestHeader. The broker closes the connection on each
// (an InvalidRequestException in its socket server), except that an
// ApiVersions request of an unknown version is answered (KIP-511); see
// ErrUnsupportedVersion.
var (
	ErrTruncatedHeader    = errors.New("truncated request header")
	ErrUnknownKey         = errors.New("unknown API key")
	ErrUnsupportedVersion = errors.New("API version not supported by the proxy's codec")
)

// maxKey is one past the largest API key kmsg knows; flexible[key][version]
// reports whether kmsg encodes that request version as flexible, and
// len(flexible[key]) is kmsg's max version + 1 (0 for keys kmsg does not
// know). Both are package variables initialized before anything that uses
// them (apiNames).
var maxKey, flexible = codecTable()

func codecTable() (int16, [][]bool) {
	var n int16
	for k := int16(0); k < 1024; k++ {
		if kmsg.RequestForKey(k) != nil {
			n = k + 1
		}
	}
	fl := make([][]bool, n)
	for k := int16(0); k < n; k++ {
		req := kmsg.RequestForKey(k)
		if req == nil {
			continue
		}
		f := make([]bool, req.MaxVersion()+1)
		for v := range f {
			req.SetVersion(int16(v))
			f[v] = req.IsFlexible()
		}
		fl[k] = f
	}
	return n, fl
}

// CodecMaxVersion returns the largest version of key that kmsg encodes and
// decodes, and false if kmsg does not know key.
func CodecMaxVersion(key int16) (int16, bool) {
	if key < 0 || key >= maxKey || len(flexible[key]) == 0 {
		return 0, false
	}
	return int16(len(flexible[key]) - 1), true
}

// ParseRequestHeader decodes the request header at the start of msg (a frame
// without its size prefix) with kbin.
//
// Errors: ErrTruncatedHeader; ErrUnknownKey for a key kmsg does not know;
// ErrUnsupportedVersion for a version above kmsg's (the returned header then
// has Key, Version and CorrelationID set, so an ApiVersions request can be
// answered, KIP-511). Negative versions are ErrUnsupportedVersion too.
func ParseRequestHeader(msg []byte) (RequestHeader, error) {
	b := kbin.Reader{Src: msg}
	var h RequestHeader
	h.Key = b.Int16()
	h.Version = b.Int16()
	h.CorrelationID = b.Int32()
	if !b.Ok() {
		return h, ErrTruncatedHeader
	}
	maxV, ok := CodecMaxVersion(h.Key)
	if !ok {
		return h, fmt.Errorf("%w %d", ErrUnknownKey, h.Key)
	}
	if h.Version < 0 || h.Version > maxV {
		return h, fmt.Errorf("%w: %s v%d (max v%d)", ErrUnsupportedVersion, kmsg.NameForKey(h.Key), h.Version, maxV)
	}
	h.ClientID = b.NullableString() // int16 length even in v2 headers
	h.Flexible = flexible[h.Key][h.Version]
	if h.Flexible {
		kmsg.SkipTags(&b)
	}
	if !b.Ok() {
		return h, ErrTruncatedHeader
	}
	h.Len = len(msg) - len(b.Src)
	return h, nil
}

// ResponseHeaderFlexible reports whether the response to key at version has
// a v1 response header (correlation id + tagged fields). ApiVersions
// responses never do (KIP-511).
func ResponseHeaderFlexible(key, version int16) bool {
	if key == apiVersionsKey {
		return false
	}
	v, ok := CodecMaxVersion(key)
	return ok && version >= 0 && version <= v && flexible[key][version]
}

// parseResponseHeader returns the correlation id and the header's length of
// a response message (a frame without its size prefix).
func parseResponseHeader(msg []byte, flexibleHeader bool) (corr int32, n int, err error) {
	b := kbin.Reader{Src: msg}
	corr = b.Int32()
	if flexibleHeader {
		kmsg.SkipTags(&b)
	}
	if !b.Ok() {
		return 0, 0, errors.New("truncated response header")
	}
	return corr, len(msg) - len(b.Src), nil
}

// produceAcks returns a Produce request's acks, read from its body (the
// message past the request header). v0–v2 start with acks; v3+ first carry
// the transactional id (compact in flexible versions).
func produceAcks(body []byte, version int16, flexibleVersion bool) (int16, error) {
	b := kbin.Reader{Src: body}
	if version >= 3 {
		if flexibleVersion {
			b.CompactNullableString()
		} else {
			b.NullableString()
		}
	}
	acks := b.Int16()
	if !b.Ok() {
		return 0, errors.New("truncated Produce request")
	}
	return acks, nil
}
