package payloadstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ObjectStore is implemented by every store in this package (and passed
// through by Wrap, with its retry policy): operations on object keys, below
// the full paths of references, that Ferry's reference rules (copy and touch,
// docs/SECURITY.md) and ferry gc (quarantine, docs/OPERATIONS.md) need
// beyond KIP-1159's PayloadStore. Keys are relative to Root: payload keys
// "<topic>/<shard>/<id>" or gc's own keys under "<topic>/.ferry-gc/".
//
// Errors are *Error; a missing object wraps ErrPayloadNotFound.
type ObjectStore interface {
	// Root is the URL prefix of every full path of the store.
	Root() Root
	// Stat describes the object at key.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// Copy copies the object at src to dst, replacing dst; server-side
	// where the store can (S3 CopyObject; the file store links the file).
	// dst's ModTime is the time of the copy.
	Copy(ctx context.Context, src, dst string) error
	// Touch sets the ModTime of the object at key to the store's now,
	// keeping its bytes (file: mtime; cloud: a copy onto itself).
	Touch(ctx context.Context, key string) error
	// Move renames src to dst: atomic in the file store (rename(2)); a
	// copy, then a delete of src, in the cloud stores.
	Move(ctx context.Context, src, dst string) error
	// Remove deletes the object at key; a missing object is not an error.
	Remove(ctx context.Context, key string) error
	// ListKeys calls fn for every object whose key starts with prefix,
	// gc's own folders included, in no particular order; it stops at fn's
	// first error and returns it.
	ListKeys(ctx context.Context, prefix string, fn func(key string, o ObjectInfo) error) error
	// Put writes b at key, replacing it atomically (gc's small objects:
	// checkpoints, manifests).
	Put(ctx context.Context, key string, b []byte) error
	// Get reads the object at key, at most max bytes (more is an error).
	Get(ctx context.Context, key string, max int64) ([]byte, error)
}

// ErrObjectTooLarge: Get found an object over its caller's bound.
var ErrObjectTooLarge = errors.New("object larger than the caller reads")

// Objects returns the ObjectStore of s (through a Wrap), or an *Error when
// s has none (a store registered from outside this package).
func Objects(s PayloadStore) (ObjectStore, error) {
	if o, ok := s.(ObjectStore); ok {
		return o, nil
	}
	if c, ok := s.(*CachedStore); ok {
		return Objects(c.PayloadStore)
	}
	return nil, &Error{Op: "open", Path: s.Class(), Err: fmt.Errorf("the %s store has no key-level operations (payloadstore.ObjectStore)", s.Class())}
}

// CopyToTopic gives topic its own object for the payload at fullPath (a
// reference into another topic of the same store): content ids keep their
// id, other ids get a fresh one from the store's generator. When the object
// is already topic's, it is touched instead (its ModTime becomes now), so
// that ferry gc counts its age from this use. It returns the full path the
// record should now carry. It is PlanCopyToTopic and Rebinding.Do.
//
// Errors: ErrInvalidPath for a path outside the store, ErrPayloadNotFound
// when the source is gone, and the store's errors.
func CopyToTopic(ctx context.Context, s PayloadStore, fullPath, topic string) (string, error) {
	r, err := PlanCopyToTopic(s, fullPath, topic)
	if err != nil {
		return "", err
	}
	return r.Path, r.Do(ctx, s)
}

// Rebinding is a CopyToTopic decided but not done: a copy of the object at
// key Src to key Dst, or a touch when they are equal; Path is the full path
// of Dst.
type Rebinding struct {
	Src, Dst, Path string
}

// PlanCopyToTopic decides CopyToTopic without I/O: it checks that fullPath
// lies in s and picks the copy's key.
func PlanCopyToTopic(s PayloadStore, fullPath, topic string) (Rebinding, error) {
	ops, err := Objects(s)
	if err != nil {
		return Rebinding{}, err
	}
	src, kp, err := ops.Root().KeyOf(fullPath)
	if err != nil {
		return Rebinding{}, err
	}
	if kp.Topic == topic {
		return Rebinding{Src: src, Dst: src, Path: fullPath}, nil
	}
	id := kp.ID
	if !isHexDigest(id) {
		id = s.ID(Payload{})
	}
	dst, err := objectKey(topic, id)
	if err != nil {
		return Rebinding{}, err
	}
	return Rebinding{Src: src, Dst: dst, Path: ops.Root().Path(dst)}, nil
}

// Do performs the copy (or the touch).
func (r Rebinding) Do(ctx context.Context, s PayloadStore) error {
	ops, err := Objects(s)
	if err != nil {
		return err
	}
	if r.Src == r.Dst {
		return ops.Touch(ctx, r.Src)
	}
	return ops.Copy(ctx, r.Src, r.Dst)
}

// Undo removes the copy Do made, unless it is named by content id (other
// records may reference it) or was a touch.
func (r Rebinding) Undo(ctx context.Context, s PayloadStore) error {
	if r.Src == r.Dst || IsContentID(r.Dst) {
		return nil
	}
	ops, err := Objects(s)
	if err != nil {
		return err
	}
	return ops.Remove(ctx, r.Dst)
}

// gcFolder is the key segment under a topic's prefix that holds ferry gc's
// own objects (quarantine, checkpoints). Payload ids never start with ".",
// and listing a topic's payloads (Lister) skips it.
const gcFolder = ".ferry-gc"

// GCPrefix is the key prefix of ferry gc's own objects for topic.
func GCPrefix(topic string) (string, error) {
	p, err := TopicPrefix(topic)
	if err != nil {
		return "", err
	}
	return p + gcFolder + "/", nil
}

// isGCKey reports whether key lies in a gc folder (skipped by List).
func isGCKey(key string) bool {
	return strings.Contains(key, "/"+gcFolder+"/")
}

// isHexDigest reports whether id is 64 lowercase hex digits (a SHA-256
// content id).
func isHexDigest(id string) bool {
	if len(id) != 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
