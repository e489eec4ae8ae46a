package envelope

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io"

	"github.com/tink-crypto/tink-go/v2/streamingaead/subtle"
	"github.com/tink-crypto/tink-go/v2/streamingaead/subtle/noncebased"
	tinksubtle "github.com/tink-crypto/tink-go/v2/subtle"
)

// Tink's AES256_GCM_HKDF streaming parameters (docs/FORMAT.md §9.2).
const (
	tinkHKDF     = "SHA256"
	tinkKeyBytes = 32
	tinkHeader   = 1 + tinkKeyBytes + subtle.AESGCMHKDFNoncePrefixSizeInBytes // 40
	tinkTagBytes = subtle.AESGCMHKDFTagSizeInBytes                            // 16
	payloadLabel = "ferry-payload-v1"
	recordLabel  = "ferry-record-v1"
)

// PayloadAAD binds a sealed object to its topic and its object key
// ("<topic>/<shard>/<id>", relative to the store's root), so that an object
// moved or copied to another key, or swapped with another object, even one
// under the same data key, fails to authenticate.
type PayloadAAD struct {
	Topic string
	Key   string
}

// StreamSealer seals objects with one data key: the header (and so its
// length) is fixed, which makes SealedSize exact. Get one per object from
// Keyring.NewStreamSealer; it counts as one use of its data key.
type StreamSealer struct {
	h       header
	hb      []byte
	segment int
	key     []byte
	// salt and noncePrefix are Tink's header fields, drawn once per
	// sealer: every NewWriter of one sealer writes the same bytes for the
	// same plaintext (a store that reads its body twice, to hash it and
	// to upload it, sees one object).
	salt, noncePrefix []byte
}

// NewStreamSealer returns a sealer for one object of scope (its topic),
// with the scope's current data key (a KMS call when a new one is needed:
// errors wrap ErrKMS, or ErrDecryptOnly without a key URL).
func (k *Keyring) NewStreamSealer(ctx context.Context, scope string) (*StreamSealer, error) {
	dk, err := k.sealKey(ctx, scope)
	if err != nil {
		return nil, err
	}
	r := make([]byte, tinkKeyBytes+subtle.AESGCMHKDFNoncePrefixSizeInBytes)
	if _, err := rand.Read(r); err != nil {
		return nil, err
	}
	return newStreamSealer(dk, r[:tinkKeyBytes], r[tinkKeyBytes:]), nil
}

// newStreamSealer is a sealer with the given data key, salt (32 bytes) and
// nonce prefix (7 bytes): random ones in NewStreamSealer, fixed ones for
// the test vectors of docs/FORMAT.md.
func newStreamSealer(dk dataKey, salt, noncePrefix []byte) *StreamSealer {
	h := header{alg: AlgStreamAES256GCMHKDF, segment: DefaultSegmentBytes, kek: dk.kek, wrapped: dk.wrapped}
	return &StreamSealer{h: h, hb: h.appendTo(nil), segment: DefaultSegmentBytes, key: dk.key, salt: salt, noncePrefix: noncePrefix}
}

// HeaderBytes is the length of the Ferry header the sealer writes.
func (s *StreamSealer) HeaderBytes() int { return len(s.hb) }

// SealedSize is the exact size in bytes of the sealed object for a
// plaintext of plain bytes: the Ferry header, Tink's 40-byte header, the
// plaintext, and a 16-byte tag per segment.
func (s *StreamSealer) SealedSize(plain int64) int64 {
	return int64(len(s.hb)) + streamSize(plain, s.segment)
}

// streamSize is the size of Tink's ciphertext for plain bytes in segments of
// segment bytes: the first segment holds segment-16-40 plaintext bytes, the
// others segment-16; the last is written at Close, even when empty.
func streamSize(plain int64, segment int) int64 {
	first := int64(segment - tinkTagBytes - tinkHeader)
	n := int64(1)
	if plain > first {
		per := int64(segment - tinkTagBytes)
		n += (plain - first + per - 1) / per
	}
	return tinkHeader + plain + n*tinkTagBytes
}

// PlainSize inverts SealedSize for a sealed object of sealed bytes whose
// header is headerBytes long, segmented by segment bytes; false when no
// plaintext size seals to exactly sealed bytes.
func PlainSize(sealed int64, headerBytes, segment int) (int64, bool) {
	body := sealed - int64(headerBytes) - tinkHeader
	if body < tinkTagBytes {
		return 0, false
	}
	per := int64(segment)
	// Full segments of the ciphertext body, the first one shorter by the
	// Tink header; the last holds the rest (at least its tag).
	first := per - tinkHeader
	if body <= first {
		return body - tinkTagBytes, true
	}
	rest := body - first
	n := 1 + (rest+per-1)/per
	plain := body - n*tinkTagBytes
	return plain, streamSize(plain, segment) == sealed-int64(headerBytes)
}

// NewWriter returns a writer that seals what is written to it into w,
// bound to a: the Ferry header and Tink's header are written at once, each
// segment when it is full, the last one at Close, which must be called
// (and its error checked) for the object to be complete. The writer
// holds two segments of buffers. It writes what Tink's
// AESGCMHKDF.NewEncryptingWriter writes, with the sealer's salt and nonce
// prefix instead of fresh ones, so that NewWriter called again (a retry
// from offset 0) writes the same bytes for the same plaintext.
func (s *StreamSealer) NewWriter(w io.Writer, a PayloadAAD) (io.WriteCloser, error) {
	dkey, err := tinksubtle.ComputeHKDF(tinkHKDF, s.key, s.salt, aad(payloadLabel, s.hb, a.Topic, a.Key), tinkKeyBytes)
	if err != nil {
		return nil, err
	}
	gcm, err := newGCM(dkey)
	if err != nil {
		return nil, err
	}
	head := make([]byte, 0, len(s.hb)+tinkHeader)
	head = append(append(append(append(head, s.hb...), tinkHeader), s.salt...), s.noncePrefix...)
	if _, err := w.Write(head); err != nil {
		return nil, err
	}
	return noncebased.NewWriter(noncebased.WriterParams{
		W:                            w,
		SegmentEncrypter:             segmentSealer{gcm},
		NonceSize:                    subtle.AESGCMHKDFNonceSizeInBytes,
		NoncePrefix:                  s.noncePrefix,
		PlaintextSegmentSize:         s.segment - tinkTagBytes,
		FirstCiphertextSegmentOffset: tinkHeader,
	})
}

// segmentSealer seals one Tink segment with AES-GCM, no associated data
// (the binding is in the derived key), into dst's storage when it fits.
type segmentSealer struct{ gcm cipher.AEAD }

func (e segmentSealer) EncryptSegment(segment, nonce []byte) ([]byte, error) {
	return e.EncryptSegmentWithDst(nil, segment, nonce)
}

func (e segmentSealer) EncryptSegmentWithDst(dst, segment, nonce []byte) ([]byte, error) {
	return e.gcm.Seal(dst[:0], nonce, segment, nil), nil
}

// OpenStream reads a sealed object's header from r, unwraps its data key
// (cached, or one KMS call) and returns a reader of its plaintext, bound to
// a. Each segment is authenticated before any of its bytes are returned;
// an altered, reordered or missing segment, or a truncated end, makes Read
// fail with ErrAuthentication instead of returning io.EOF.
//
// Errors: ErrNotSealed (r does not start with Magic), ErrFormat,
// ErrUnknownKey, ErrKMS (a *KMSError), ErrAuthentication, or r's own.
func (k *Keyring) OpenStream(ctx context.Context, r io.Reader, a PayloadAAD) (io.Reader, error) {
	// Every read goes through src, which remembers a failure of r itself
	// (a cut download, a throttled or reset GET): that is r's error, never
	// ErrFormat or ErrAuthentication, which say the bytes are at fault.
	src := &countingReader{r: r}
	r = src
	fixed := make([]byte, fixedHeaderBytes)
	if n, err := io.ReadFull(r, fixed); err != nil {
		if src.err != nil {
			return nil, src.err
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			if IsSealed(fixed[:n]) {
				return nil, fmt.Errorf("%w: %d bytes, the header alone is %d", ErrFormat, n, fixedHeaderBytes)
			}
			return nil, ErrNotSealed
		}
		return nil, err
	}
	h, n, err := parseFixed(fixed)
	if err != nil {
		return nil, err
	}
	if h.alg != AlgStreamAES256GCMHKDF {
		return nil, fmt.Errorf("%w: algorithm %d is not an object's", ErrFormat, h.alg)
	}
	h.wrapped = make([]byte, n)
	if _, err := io.ReadFull(r, h.wrapped); err != nil {
		if src.err != nil {
			return nil, src.err
		}
		return nil, fmt.Errorf("%w: wrapped data key cut short: %v", ErrFormat, err)
	}
	o, err := k.openKey(ctx, h.kek, h.wrapped)
	if err != nil {
		return nil, err
	}
	t, err := subtle.NewAESGCMHKDF(o.key, tinkHKDF, tinkKeyBytes, int(h.segment), 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	hb := h.appendTo(make([]byte, 0, h.len()))
	src.n = 0 // counts from the segments' stream (Tink's header)
	dr, err := t.NewDecryptingReader(src, aad(payloadLabel, hb, a.Topic, a.Key))
	if err != nil {
		if src.err != nil {
			return nil, src.err
		}
		return nil, fmt.Errorf("%w: %v", ErrAuthentication, err)
	}
	return &authReader{r: dr, src: src}, nil
}

// countingReader counts the bytes read through it and remembers the first
// error other than io.EOF that its source returned.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// authReader maps Tink's decryption failures to ErrAuthentication.
type authReader struct {
	r   io.Reader
	src *countingReader
	err error
}

func (a *authReader) Read(p []byte) (int, error) {
	if a.err != nil {
		return 0, a.err
	}
	n, err := a.r.Read(p)
	if err == io.EOF && a.src.n < tinkHeader+tinkTagBytes {
		// Tink's reader ends quietly when not even one segment follows
		// its header: an object cut right after it must not read as an
		// empty payload. Every sealed object has a last segment, at
		// least its tag.
		err = fmt.Errorf("%w: the object ends after its header, with no segment", ErrAuthentication)
	}
	if err != nil && err != io.EOF {
		switch {
		case a.src.err != nil:
			// The source failed (Tink passed its error on, or took an
			// io.ErrUnexpectedEOF of the source for the object's end
			// and failed to authenticate what it had): the source's
			// failure, which another download may not meet.
			err = a.src.err
		default:
			err = fmt.Errorf("%w: %v", ErrAuthentication, err)
		}
		a.err = err
	}
	return n, err
}

// FixedHeaderBytes is how many bytes of a sealed object PlainSizeOf needs.
const FixedHeaderBytes = fixedHeaderBytes

// PlainSizeOf returns the plaintext size of a sealed object of sealed bytes
// whose first bytes are head (at least FixedHeaderBytes of them). Errors:
// ErrNotSealed, ErrFormat (including a size no plaintext seals to).
func PlainSizeOf(head []byte, sealed int64) (int64, error) {
	h, n, err := parseFixed(head)
	if err != nil {
		return 0, err
	}
	if h.alg != AlgStreamAES256GCMHKDF {
		return 0, fmt.Errorf("%w: algorithm %d is not an object's", ErrFormat, h.alg)
	}
	p, ok := PlainSize(sealed, fixedHeaderBytes+n, int(h.segment))
	if !ok {
		return 0, fmt.Errorf("%w: %d bytes is no sealed object's size", ErrFormat, sealed)
	}
	return p, nil
}
