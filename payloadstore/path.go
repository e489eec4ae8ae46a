package payloadstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Bounds of an object key (docs/FORMAT.md §7), checked before any I/O: S3
// and GCS refuse keys over 1024 bytes, and most file systems a path segment
// over 255 bytes (NAME_MAX). Kafka topic names are at most 249 characters.
const (
	MaxKeyBytes     = 1024
	MaxSegmentBytes = 255
	maxTopicBytes   = 249
)

// Root is the URL prefix every full path of one store starts with, e.g.
// "file:///var/ferry" or "s3://bucket/prefix". A full path is Root + "/" +
// key, where key is the object's name inside the store
// ("<topic>/<shard>/<id>", see ParseKey).
type Root string

// Path returns the full path of key.
func (r Root) Path(key string) string { return string(r) + "/" + key }

// Key returns the key of fullPath, or an *Error wrapping ErrInvalidPath
// when fullPath does not lie inside r or its key is not a payload key
// (ParseKey): another scheme, bucket or directory, a key of another layout,
// a "." or ".." segment, a forbidden character, a key over MaxKeyBytes or a
// segment over MaxSegmentBytes. The check runs before any I/O and is not
// retryable; it is what stops a forged reference from making a consumer read
// an arbitrary file or object.
func (r Root) Key(fullPath string) (string, error) { return r.keyFor("download", fullPath) }

// keyFor is Key with the operation its *Error names.
func (r Root) keyFor(op, fullPath string) (string, error) {
	rest, ok := strings.CutPrefix(fullPath, string(r)+"/")
	if !ok {
		return "", &Error{Op: op, Path: fullPath, Err: fmt.Errorf("%w: not under the store root %s", ErrInvalidPath, r)}
	}
	if _, why := parseKey(rest); why != "" {
		return "", &Error{Op: op, Path: fullPath, Err: fmt.Errorf("%w: %s", ErrInvalidPath, why)}
	}
	return rest, nil
}

// KeyOf is Key that also returns the key's parts.
func (r Root) KeyOf(fullPath string) (string, KeyParts, error) {
	key, err := r.Key(fullPath)
	if err != nil {
		return "", KeyParts{}, err
	}
	kp, _ := ParseKey(key)
	return key, kp, nil
}

// KeyParts are the segments of a payload key "<topic>/<shard>/<id>"
// (Shard is "" for a key of the earlier layout "<topic>/<id>").
type KeyParts struct {
	Topic, Shard, ID string
}

// ParseKey splits a payload key "<topic>/<shard>/<id>" (docs/FORMAT.md §7;
// or "<topic>/<id>", the layout before the shard segment, still readable)
// and checks it strictly: topic is a Kafka topic name (at most 249 of
// [a-zA-Z0-9._-], not "." or ".."), shard is the two lowercase hex digits
// of the first byte of SHA-256(id), id is 1..255 bytes without / \ % ? # or
// NUL and not "." or "..", and the key is at most MaxKeyBytes. Errors wrap
// ErrInvalidPath and quote the key shortened.
func ParseKey(key string) (KeyParts, error) {
	kp, why := parseKey(key)
	if why != "" {
		return KeyParts{}, fmt.Errorf("%w: object key %s: %s", ErrInvalidPath, Shorten(key), why)
	}
	return kp, nil
}

// parseKey is ParseKey returning why the key is refused ("" when it is not),
// so callers that quote the path already do not quote the key again.
func parseKey(key string) (KeyParts, string) {
	if len(key) > MaxKeyBytes {
		return KeyParts{}, fmt.Sprintf("%d bytes, more than %d", len(key), MaxKeyBytes)
	}
	topic, rest, ok1 := strings.Cut(key, "/")
	shard, id, ok2 := strings.Cut(rest, "/")
	legacy := ok1 && !ok2
	if legacy {
		// <topic>/<id>: the layout before the shard segment; such
		// references stay readable (docs/FORMAT.md §7).
		shard, id, ok2 = "", rest, true
	}
	if !ok1 || !ok2 {
		return KeyParts{}, "not <topic>/<shard>/<id>"
	}
	if err := checkTopicName(topic); err != nil {
		return KeyParts{}, "the topic " + err.Error()
	}
	if err := checkID(id); err != nil {
		return KeyParts{}, "the id " + err.Error()
	}
	if want := shardOf(id); !legacy && shard != want {
		return KeyParts{}, fmt.Sprintf("the shard does not match the id (want %s)", want)
	}
	return KeyParts{Topic: topic, Shard: shard, ID: id}, ""
}

// shardOf is the shard segment of id: the first byte of SHA-256(id) in hex.
func shardOf(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:1])
}

// objectKey is the key a payload of topic gets: "<topic>/<shard>/<id>",
// where shard is two lowercase hex digits: the first byte of SHA-256(id).
// The shard spreads one topic's objects over 256 key prefixes, because object
// stores scale request rates per prefix (S3: about 3,500 writes and 5,500
// reads per second per prefix); docs/FORMAT.md documents the layout.
func objectKey(topic, id string) (string, error) {
	if err := checkTopicName(topic); err != nil {
		return "", &Error{Op: "publish", Path: Shorten(topic), Err: fmt.Errorf("%w: topic %s %v", ErrInvalidPath, Shorten(topic), err)}
	}
	if err := checkID(id); err != nil {
		return "", &Error{Op: "publish", Path: Shorten(topic), Err: fmt.Errorf("%w: object id %s: %v", ErrInvalidPath, Shorten(id), err)}
	}
	return topic + "/" + shardOf(id) + "/" + id, nil
}

// ObjectKey is the key a payload of topic named id gets (docs/FORMAT.md
// §7). Errors wrap ErrInvalidPath.
func ObjectKey(topic, id string) (string, error) { return objectKey(topic, id) }

// TopicPrefix is the key prefix under which every payload of topic lies,
// "<topic>/"; ferry gc lists it.
func TopicPrefix(topic string) (string, error) {
	if err := checkTopicName(topic); err != nil {
		return "", &Error{Op: "list", Path: Shorten(topic), Err: fmt.Errorf("%w: topic %s %v", ErrInvalidPath, Shorten(topic), err)}
	}
	return topic + "/", nil
}

// checkTopicName applies Kafka's rule for topic names (Topic.validate):
// 1..249 characters of [a-zA-Z0-9._-], and not "." or "..".
func checkTopicName(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("is empty: a payload folder needs a topic name")
	case topic == "." || topic == "..":
		return fmt.Errorf("cannot name a payload folder")
	case len(topic) > maxTopicBytes:
		return fmt.Errorf("is %d characters, Kafka allows %d", len(topic), maxTopicBytes)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("has the character %q, which Kafka topic names cannot hold", c)
		}
	}
	return nil
}

// checkRawKey checks a key of the store's own bookkeeping (ferry gc's
// folders) or a configured prefix: relative, 1..MaxKeyBytes bytes, segments
// of 1..MaxSegmentBytes bytes, none "." or "..", no \ % ? # or NUL.
func checkRawKey(key string) error {
	if key == "" || len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: key %s: empty or over %d bytes", ErrInvalidPath, Shorten(key), MaxKeyBytes)
	}
	if strings.ContainsAny(key, "\\%?#\x00") {
		return fmt.Errorf("%w: key %s: forbidden character", ErrInvalidPath, Shorten(key))
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." || len(seg) > MaxSegmentBytes {
			return fmt.Errorf("%w: key %s: empty, relative or over-long segment", ErrInvalidPath, Shorten(key))
		}
	}
	return nil
}

func checkID(id string) error {
	switch {
	case id == "" || strings.HasPrefix(id, "."):
		return fmt.Errorf("is empty or starts with a dot (Ferry's own files: temporary uploads, gc's folder)")
	case len(id) > MaxSegmentBytes:
		return fmt.Errorf("is %d bytes, more than %d", len(id), MaxSegmentBytes)
	case strings.ContainsAny(id, "/\\%?#\x00"):
		return fmt.Errorf("holds one of / \\ %% ? # NUL")
	}
	return nil
}

// Shorten returns s as it may appear in an error: quoted, and when longer
// than 120 bytes, its first 80 and last 30 bytes around the number left
// out, so that a hostile 32 KiB path does not flood a log line.
func Shorten(s string) string {
	const head, tail = 80, 30
	if len(s) <= head+tail+10 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q…(%d bytes)…%q", s[:head], len(s)-head-tail, s[len(s)-tail:])
}

// ReferenceKey returns the parts of the payload key fullPath names in s:
// the key after the store's root where fullPath is a payload key under it
// (an ObjectStore: every store of this package), else PathKey's reading (the
// store's own check then refuses what is not its own when the path is
// opened). The topic binding of references (docs/SECURITY.md) uses it:
// without the root, "<root>/2d/<id>", a two-segment key of topic "2d",
// could read as topic <the root's last segment>, shard 2d. Errors wrap
// ErrInvalidPath.
func ReferenceKey(s PayloadStore, fullPath string) (KeyParts, error) {
	if ops, err := Objects(s); err == nil {
		if _, kp, err := ops.Root().KeyOf(fullPath); err == nil {
			return kp, nil
		}
	}
	return PathKey(fullPath)
}

// PathKey returns the parts of the payload key a full path ends with (its
// last three segments), without knowing the store's root: what a
// reference says about the topic its object belongs to, where the root is
// not known (ReferenceKey when it is: a two-segment key of the layout
// before shards can read differently here). Errors wrap ErrInvalidPath.
// The store checks the root itself when it opens the path.
func PathKey(fullPath string) (KeyParts, error) {
	if len(fullPath) > 2*MaxKeyBytes {
		return KeyParts{}, fmt.Errorf("%w: a path of %d bytes", ErrInvalidPath, len(fullPath))
	}
	// The last three segments, when the middle one is a shard of the
	// last; else the last two (the layout before shards).
	var segs [3]int
	i := len(fullPath)
	for n := range 3 {
		j := strings.LastIndexByte(fullPath[:i], '/')
		if j < 0 {
			return KeyParts{}, fmt.Errorf("%w: the path does not end in <topic>/<shard>/<id>", ErrInvalidPath)
		}
		segs[n], i = j, j
	}
	id := fullPath[segs[0]+1:]
	start := segs[2]
	if fullPath[segs[1]+1:segs[0]] != shardOf(id) {
		start = segs[1]
	}
	kp, why := parseKey(fullPath[start+1:])
	if why != "" {
		return KeyParts{}, fmt.Errorf("%w: %s", ErrInvalidPath, why)
	}
	return kp, nil
}
