package payloadstore

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"strings"

	"github.com/google/uuid"
)

// IDGenerator names objects (KIP-1159 PayloadStore.id(data)).
type IDGenerator interface {
	ID(p Payload) string
}

// IDUUID is the KIP's default: a random version-4 UUID per payload.
type IDUUID struct{}

func (IDUUID) ID(Payload) string { return uuid.NewString() }

// IDSHA256 is the content id: the payload's SHA-256 in lowercase hex. Equal
// payloads share one object, which is what compacted topics want (KIP-1159,
// "TTL and usage of Compacted Topic").
type IDSHA256 struct{}

func (IDSHA256) ID(p Payload) string { return p.HexSHA256() }

// ParseIDGenerator maps the value of large.message.payload.id.generator
// ("uuid" or "sha256"; empty means "uuid") to a generator.
func ParseIDGenerator(name string) (IDGenerator, error) {
	switch name {
	case "", "uuid":
		return IDUUID{}, nil
	case "sha256":
		return IDSHA256{}, nil
	}
	return nil, fmt.Errorf("large.message.payload.id.generator: %q is not one of uuid, sha256", name)
}

// IsContentID reports whether fullPath names an object by content id (its
// last segment is 64 lowercase hex digits, a SHA-256): such an object may be
// shared by several records (equal keys, or equal values with
// large.message.payload.id.generator=sha256), so a failed produce must never
// delete it.
func IsContentID(fullPath string) bool {
	return isHexDigest(fullPath[strings.LastIndexByte(fullPath, '/')+1:])
}

// digestReader hashes and counts what a store reads from a payload body, so
// the store can refuse to commit an object whose bytes are not the payload's
// (Size and SHA256) before anything becomes visible at its path.
type digestReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func newDigestReader(r io.Reader) *digestReader { return &digestReader{r: r, h: sha256.New()} }

// newBodyReader is newDigestReader for p's body, or a reader that only
// counts when p's digest is not wanted (p.uncheckedDigest: an encrypted
// store's sealed bytes, which it authenticates and hashes as plaintext).
func newBodyReader(p Payload) *digestReader {
	r := io.LimitReader(p.Body, p.Size+1)
	if p.uncheckedDigest {
		return &digestReader{r: r}
	}
	return newDigestReader(r)
}

func (d *digestReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if d.h != nil {
		d.h.Write(p[:n])
	}
	d.n += int64(n)
	return n, err
}

// sum is the digest of the bytes read so far (zero when only counting).
func (d *digestReader) sum() (s [sha256.Size]byte) {
	if d.h != nil {
		d.h.Sum(s[:0])
	}
	return s
}

// check returns an ErrPayloadChanged error when the bytes read differ from p
// in length, or in digest when p.SHA256 is set (not Unhashed). It returns
// the digest of the bytes read.
func (d *digestReader) check(p Payload) ([sha256.Size]byte, error) {
	got := d.sum()
	if d.n != p.Size {
		return got, fmt.Errorf("%w: body gave %d bytes, want %d", ErrPayloadChanged, d.n, p.Size)
	}
	if !p.Unhashed && p.SHA256 != ([sha256.Size]byte{}) && got != p.SHA256 {
		return got, fmt.Errorf("%w: body has SHA-256 %x, the payload %x", ErrPayloadChanged, got, p.SHA256)
	}
	return got, nil
}
