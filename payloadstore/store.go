// Package payloadstore holds the PayloadStore contract of KIP-1159 ("Large
// message reference based Serializer"), its errors, the retry and
// custom-metadata policy that wraps every store, and the registry that opens a
// store from a URL ("file:///var/ferry", "mem://demo").
//
// A PayloadStore keeps the bytes of records too large for Kafka. The
// serializer publishes a payload and puts the returned full path into a
// PayloadReferenceValue; the deserializer downloads it again by that path.
package payloadstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ferrykit/ferry/internal/ctxio"
)

// Payload is one object to publish.
//
// Body yields exactly Size bytes when read from offset 0. Publish may read it
// more than once: a retry seeks Body back to offset 0 first, so Body must stay
// valid until Publish returns. SHA256 is the digest of those Size bytes; the
// content-derived id (IDSHA256) and the reference's digest header use it.
type Payload struct {
	Body   io.ReadSeeker
	Size   int64
	SHA256 [sha256.Size]byte
	// Unhashed says SHA256 is not set (StreamPayload): the store hashes
	// the bytes as it writes them and returns their digest in
	// PayloadResponse.SHA256, so a payload that is not in memory is read
	// once. A store that needs the digest before it writes (a content id;
	// a cloud store, which puts it in the object's metadata; a store from
	// outside this package, behind Wrap) hashes Body first: OnePass says
	// which.
	Unhashed bool
	// ReadOnce (with Unhashed; OncePayload) says Body can be read once,
	// from its start to its end, and never again (a client's socket):
	// Publish makes one attempt (no whole-payload retry: a cloud upload
	// still retries its parts, which its uploader buffers), bounds the
	// time between two reads of Body instead of the whole publish by
	// large.message.payload.store.timeout.ms, and fails with
	// ErrNotRewindable, reading nothing, when the store needs the digest
	// before it writes (a content id; see OnePass).
	ReadOnce bool
	// ID, when set, names the object instead of the store's ID(payload); the
	// serializer sets it to the content id for offloaded keys, so that equal
	// key bytes always give the same reference (partitioning, compaction).
	ID string
	// uncheckedDigest (Unhashed payloads of an encrypted store only): the
	// file and mem stores count the bytes but do not hash them, and
	// PayloadResponse.SHA256 is zero. The sealed bytes are authenticated
	// by their AEAD, and the encrypted store hashes the plaintext itself.
	uncheckedDigest bool
}

// BytesPayload returns a Payload over b without copying it.
func BytesPayload(b []byte) Payload {
	return Payload{Body: bytes.NewReader(b), Size: int64(len(b)), SHA256: sha256.Sum256(b)}
}

// StreamPayload returns an Unhashed Payload of the size bytes body yields
// from offset 0 (a file): the store hashes it as it writes it, and the
// digest comes back in PayloadResponse.SHA256. Bytes that are not size long
// when the store reads them fail the publish with ErrPayloadChanged, and
// nothing is left at the object's path.
func StreamPayload(body io.ReadSeeker, size int64) Payload {
	return Payload{Body: body, Size: size, Unhashed: true}
}

// OncePayload returns a ReadOnce, Unhashed Payload of the size bytes r
// yields (a value as it arrives from a client's socket): the store hashes
// it as it writes it, and the digest comes back in PayloadResponse.SHA256.
// r must end after size bytes (io.LimitReader): a store reads up to the
// end to check the size. An r that ends early fails the publish with
// ErrPayloadChanged, and nothing is left at the object's path.
func OncePayload(r io.Reader, size int64) Payload {
	return Payload{Body: &onceBody{r: r}, Size: size, Unhashed: true, ReadOnce: true}
}

// onceBody is the Body of a ReadOnce payload: a seek to its start is
// allowed only before the first byte is read.
type onceBody struct {
	r io.Reader
	n int64
}

func (b *onceBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *onceBody) Seek(off int64, whence int) (int64, error) {
	if b.n == 0 && off == 0 && (whence == io.SeekStart || whence == io.SeekCurrent) {
		return 0, nil
	}
	return b.n, fmt.Errorf("%w (%d bytes already read)", ErrNotRewindable, b.n)
}

// OnePass reports whether s publishes p, an Unhashed payload, in one pass
// over its body: hashing what it writes. Otherwise Publish reads the body
// twice, to hash it, then to write it: for a content id (IDSHA256, or p.ID
// empty with large.message.payload.id.generator=sha256), for the cloud
// stores (the digest goes into the object's metadata, set before the
// upload), and for stores from outside this package (through Wrap). A
// caller that wants to show the hashing (a progress bar) can hash first
// itself when OnePass is false.
func OnePass(s PayloadStore, p Payload) bool {
	h, ok := Unwrap(s).(hashingStore)
	return ok && h.onePass(p)
}

// hashingStore is a store of this package: its Publish hashes what it
// writes (digestReader), refuses bytes that are not the payload's before
// the object becomes visible (ErrPayloadChanged), returns their digest in
// PayloadResponse.SHA256, and writes an Unhashed payload in one pass when
// onePass says so (it hashes it first otherwise).
type hashingStore interface {
	PayloadStore
	onePass(p Payload) bool
}

// randomIDs reports whether gen names objects without their content (so
// that an Unhashed payload can be named before it is hashed).
func randomIDs(gen IDGenerator) bool {
	switch gen.(type) {
	case nil, IDUUID, *IDUUID:
		return true
	}
	return false
}

// hashFirst returns p with its SHA256 set from reading Body from offset 0
// (p itself when it is not Unhashed): for a store that needs the digest
// before it writes. Body must yield exactly p.Size bytes (ErrPayloadChanged
// otherwise).
func hashFirst(ctx context.Context, p Payload) (Payload, error) {
	if !p.Unhashed {
		return p, nil
	}
	if p.ReadOnce {
		return p, fmt.Errorf("%w: the store needs the payload's SHA-256 before it writes it (a content id)", ErrNotRewindable)
	}
	if _, err := p.Body.Seek(0, io.SeekStart); err != nil {
		return p, err
	}
	d := newDigestReader(io.LimitReader(p.Body, p.Size+1))
	if _, err := ctxio.Copy(ctx, io.Discard, d); err != nil {
		return p, err
	}
	if d.n != p.Size {
		return p, fmt.Errorf("%w: body gave %d bytes, want %d", ErrPayloadChanged, d.n, p.Size)
	}
	p.SHA256, p.Unhashed = d.sum(), false
	return p, nil
}

// FilePayload hashes f from its start and returns a Payload that reads it.
// f must stay open until the Payload has been published. Errors are those of
// reading f. StreamPayload publishes a file in one pass where the store
// allows it (OnePass): the digest is then known only after Publish.
func FilePayload(f *os.File) (Payload, error) {
	h := sha256.New()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Payload{}, err
	}
	n, err := io.Copy(h, f)
	if err != nil {
		return Payload{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Payload{}, err
	}
	p := Payload{Body: f, Size: n}
	copy(p.SHA256[:], h.Sum(nil))
	return p, nil
}

// HexSHA256 is the lowercase hex form of the payload digest, as carried in
// the ferry.payload.sha256 header.
func (p Payload) HexSHA256() string { return hex.EncodeToString(p.SHA256[:]) }

// PayloadResponse is what Publish returns (KIP-1159 PayloadResponse).
type PayloadResponse struct {
	// FullPayloadPath names the object: the store's root URL, "/", then the
	// object key, e.g. "file:///var/ferry/orders/3f2c…". It never contains
	// credentials. It is what the PayloadReferenceValue carries.
	FullPayloadPath string
	// CustomMetadata is opaque bytes the store wants carried with the
	// reference (KIP-917); nil for none. At most
	// large.message.payload.store.custom.metadata.max.bytes long.
	CustomMetadata []byte
	// SHA256 is the digest of the object's bytes: computed by the store as
	// it wrote them (every store of this package does, which is how an
	// Unhashed payload gets its digest), or, through Wrap, the payload's
	// own. It is zero when a store from outside this package was called
	// directly, not through Wrap.
	SHA256 [sha256.Size]byte
}

// PayloadStore is the Go shape of KIP-1159's PayloadStore interface.
//
// Implementations must be safe for concurrent use. They return errors of type
// *Error (KIP-1159 PayloadStoreException) whose Retryable field says whether
// the same call may succeed later; a missing object is reported with an
// *Error that wraps ErrPayloadNotFound. Retries, the total time bound and the
// custom-metadata size rule are not the store's job: Wrap adds them.
type PayloadStore interface {
	// Publish writes p under topic and returns its full path. The object is
	// visible at that path only once it is completely written: a failed or
	// interrupted Publish never leaves a partial object at a path a
	// reference could name.
	Publish(ctx context.Context, topic string, p Payload) (PayloadResponse, error)
	// Download opens the object named by fullPath (as returned by Publish)
	// for reading. It returns an *Error wrapping ErrInvalidPath when
	// fullPath lies outside this store, and one wrapping ErrPayloadNotFound
	// when the object does not exist.
	Download(ctx context.Context, fullPath string) (io.ReadCloser, error)
	// Delete removes the object named by fullPath; deleting a missing object
	// is not an error.
	Delete(ctx context.Context, fullPath string) error
	// ID names the object for p when p.ID is empty (KIP-1159 id(data)):
	// a random UUID by default, or the payload's SHA-256 in hex when the
	// store was opened with large.message.payload.id.generator=sha256.
	ID(p Payload) string
	// Class is the payloadStoreClass written into references, e.g.
	// "ferry.payloadstore.FileStore".
	Class() string
	// Close releases the store's resources.
	Close() error
}

// PublishBytes publishes b under topic; a convenience over Publish.
func PublishBytes(ctx context.Context, s PayloadStore, topic string, b []byte) (PayloadResponse, error) {
	return s.Publish(ctx, topic, BytesPayload(b))
}

// DownloadBytes reads the whole object at fullPath into memory.
func DownloadBytes(ctx context.Context, s PayloadStore, fullPath string) ([]byte, error) {
	rc, err := s.Download(ctx, fullPath)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, &Error{Op: "download", Path: fullPath, Retryable: true, Err: err}
	}
	return b, nil
}

// objectID returns p.ID or the generator's id.
func objectID(gen IDGenerator, p Payload) string {
	if p.ID != "" {
		return p.ID
	}
	return gen.ID(p)
}

// ObjectInfo describes one stored object, as listed by a Lister.
type ObjectInfo struct {
	// FullPath is the object's full path, as a reference would carry it.
	FullPath string
	// Size is the object's length in bytes.
	Size int64
	// ModTime is when the object was last written, copied or touched (the
	// store's clock).
	ModTime time.Time
	// Version changes whenever the object is rewritten or touched (file:
	// inode and mtime; cloud: ETag and ModTime); "" when unknown.
	Version string
}

// Lister is implemented by stores that can enumerate the payloads of a topic;
// `ferry gc` needs it. Every store in this package implements it, and Wrap
// passes it through.
type Lister interface {
	// List calls fn for every object under the topic's prefix
	// ("<topic>/"), in no particular order, and stops at fn's first error,
	// which it returns. Objects still being written are not listed.
	List(ctx context.Context, topic string, fn func(ObjectInfo) error) error
}

// List lists the payloads of topic in s (see Lister). It returns an *Error
// when s cannot list.
func List(ctx context.Context, s PayloadStore, topic string, fn func(ObjectInfo) error) error {
	l, ok := Unwrap(s).(Lister)
	if !ok {
		return &Error{Op: "list", Path: topic, Err: fmt.Errorf("the %s store cannot list its objects", s.Class())}
	}
	return l.List(ctx, topic, fn)
}
