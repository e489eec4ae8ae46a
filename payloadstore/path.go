package payloadstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Root is the URL prefix every full path of one store starts with, e.g.
// "file:///var/ferry" or "s3://bucket/prefix". A full path is Root + "/" +
// key, where key is the object's name inside the store ("orders/<id>").
type Root string

// Path returns the full path of key.
func (r Root) Path(key string) string { return string(r) + "/" + key }

// Key returns the key of fullPath, or an *Error wrapping ErrInvalidPath when
// fullPath does not lie inside r: another scheme, bucket or directory, an
// absolute or empty key, a "." or ".." segment, an empty segment, or any of
// the characters \ % ? # and NUL (which could smuggle an escape past this
// check). This is the check that stops a forged reference from making a
// consumer read an arbitrary file or object.
func (r Root) Key(fullPath string) (string, error) {
	bad := func(why string) (string, error) {
		return "", &Error{Op: "download", Path: fullPath, Err: fmt.Errorf("%w: %s (store root %s)", ErrInvalidPath, why, r)}
	}
	rest, ok := strings.CutPrefix(fullPath, string(r)+"/")
	if !ok {
		return bad("not under the store root")
	}
	if rest == "" {
		return bad("empty object key")
	}
	if strings.ContainsAny(rest, "\\%?#\x00") {
		return bad("forbidden character in object key")
	}
	for _, seg := range strings.Split(rest, "/") {
		switch seg {
		case "":
			return bad("empty path segment")
		case ".", "..":
			return bad("relative path segment")
		}
	}
	return rest, nil
}

// objectKey is the key a payload of topic gets: "<topic>/<shard>/<id>",
// where shard is two lowercase hex digits: the first byte of SHA-256(id).
// The shard spreads one topic's objects over 256 key prefixes, because object
// stores scale request rates per prefix (S3: about 3,500 writes and 5,500
// reads per second per prefix); docs/FORMAT.md documents the layout. Kafka
// topic names use only [a-zA-Z0-9._-] and are never "." or "..", so the topic
// is a safe single segment; ids are UUIDs or hex digests.
func objectKey(topic, id string) (string, error) {
	if err := checkTopic(topic); err != nil {
		return "", err
	}
	if id == "" || strings.ContainsAny(id, "/\\%?#\x00") || id == "." || id == ".." {
		return "", &Error{Op: "publish", Path: topic, Err: fmt.Errorf("%w: object id %q", ErrInvalidPath, id)}
	}
	sum := sha256.Sum256([]byte(id))
	return topic + "/" + hex.EncodeToString(sum[:1]) + "/" + id, nil
}

// TopicPrefix is the key prefix under which every payload of topic lies,
// "<topic>/"; ferry gc lists it.
func TopicPrefix(topic string) (string, error) {
	if err := checkTopic(topic); err != nil {
		return "", err
	}
	return topic + "/", nil
}

func checkTopic(topic string) error {
	if topic == "" || topic == "." || topic == ".." || strings.ContainsAny(topic, "/\\%?#\x00") {
		return &Error{Op: "publish", Path: topic, Err: fmt.Errorf("%w: topic %q cannot name a payload folder", ErrInvalidPath, topic)}
	}
	return nil
}
