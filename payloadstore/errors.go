package payloadstore

import (
	"errors"
	"fmt"
)

var (
	// ErrPayloadNotFound: the object a reference names does not exist
	// (KIP-1159 PayloadNotFoundException), e.g. because a bucket TTL removed it.
	ErrPayloadNotFound = errors.New("payload not found")
	// ErrInvalidPath: a full path that does not lie inside the configured
	// store (another scheme or bucket, an absolute path, "..", escapes), or
	// whose key is not a payload key of docs/FORMAT.md §7 (another layout,
	// a key over MaxKeyBytes, a segment over MaxSegmentBytes). Checked
	// before any I/O; never retryable.
	ErrInvalidPath = errors.New("payload path lies outside the configured payload store")
	// ErrWrongTopic: a reference names an object of another topic than the
	// record that carries it (references are bound to their topic:
	// docs/SECURITY.md). It wraps ErrInvalidPath.
	ErrWrongTopic = fmt.Errorf("%w: the reference names an object of another topic", ErrInvalidPath)
	// ErrCustomMetadataTooLarge: the store returned more custom metadata than
	// large.message.payload.store.custom.metadata.max.bytes allows (KIP-917);
	// the uploaded object has been deleted.
	ErrCustomMetadataTooLarge = errors.New("payload store custom metadata exceeds large.message.payload.store.custom.metadata.max.bytes")
	// ErrPayloadChanged: the bytes a store read while publishing differ
	// from the payload's Size or SHA256 (its source changed during the
	// upload); the object has been deleted and nothing references it.
	ErrPayloadChanged = errors.New("payload changed while it was being published")
	// ErrNotRewindable: a ReadOnce payload (OncePayload) would have to be
	// read again: a retry after part of it was read, or a store that
	// hashes a payload before it writes it (a content id from
	// large.message.payload.id.generator=sha256). Never retryable.
	ErrNotRewindable = errors.New("a read-once payload cannot be read again")
	// ErrInvalidConfig: the store URL or its settings are wrong (malformed
	// URL, no bucket, credentials in the URL, a bad prefix or parameter, a
	// part size below the minimum, a missing bucket, a file store directory
	// that does not exist and cannot be created). Another attempt will not
	// help; fix the configuration.
	ErrInvalidConfig = errors.New("invalid payload store configuration")
	// ErrUnknownScheme: Open was given a URL whose scheme no store registered.
	ErrUnknownScheme = errors.New("no payload store is registered for this URL scheme")
)

// Error is a failed store operation (KIP-1159 PayloadStoreException).
//
// Op is "publish", "download", "delete" or "open"; Path the full path or
// topic concerned; Retryable tells the retry policy whether the same call may
// succeed later (a timeout, a connection reset, HTTP 5xx/429) or never will
// (not found, invalid path, permission denied). Err is the cause; use
// errors.Is(err, ErrPayloadNotFound) and friends to test it.
type Error struct {
	Op        string
	Path      string
	Retryable bool
	Err       error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("payload store %s %s: %v", e.Op, Shorten(e.Path), e.Err)
	if e.Retryable {
		s += " (retryable)"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// IsRetryable reports whether err is worth retrying: an *Error with
// Retryable set. Context errors are never retryable.
func IsRetryable(err error) bool {
	var se *Error
	if errors.As(err, &se) {
		return se.Retryable
	}
	return false
}
