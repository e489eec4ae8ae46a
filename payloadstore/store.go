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
	// ID, when set, names the object instead of the store's ID(payload); the
	// serializer sets it to the content id for offloaded keys, so that equal
	// key bytes always give the same reference (partitioning, compaction).
	ID string
}

// BytesPayload returns a Payload over b without copying it.
func BytesPayload(b []byte) Payload {
	return Payload{Body: bytes.NewReader(b), Size: int64(len(b)), SHA256: sha256.Sum256(b)}
}

// FilePayload hashes f from its start and returns a Payload that reads it.
// f must stay open until the Payload has been published. Errors are those of
// reading f.
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
