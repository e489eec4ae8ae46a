// Package largemessage is Ferry's KIP-1159 large-message Serializer and
// Deserializer: records over large.message.threshold.bytes have their value
// (or key) published to a payload store, and Kafka carries a small
// PayloadReferenceValue instead, marked by the header "large-message: true".
//
// The wire format is specified, with test vectors, in docs/FORMAT.md.
package largemessage

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kbin"
)

// ReferenceVersion is the only PayloadReferenceValue version (KIP-1159).
const ReferenceVersion int16 = 0

// PayloadReferenceValue is the record value Kafka carries for an offloaded
// payload (KIP-1159, "PayloadReferenceValue", version 0).
//
// Encoded as Kafka encodes its generated non-flexible messages: int16 version
// (0), then each field as a STRING (int16 length, then that many UTF-8
// bytes), in schema order: fullPayloadPath, payloadStoreClass.
type PayloadReferenceValue struct {
	// FullPayloadPath names the object in the store, e.g.
	// "file:///var/ferry/orders/5f0c…" or "s3://bucket/prefix/orders/…".
	FullPayloadPath string
	// PayloadStoreClass names the store that wrote it, e.g.
	// "ferry.payloadstore.FileStore"; a consumer whose store differs gets a
	// clear error rather than a confusing not-found.
	PayloadStoreClass string
}

// ErrCorruptReference: a record marked large-message whose value is not a
// valid version-0 PayloadReferenceValue.
var ErrCorruptReference = errors.New("the value is not a PayloadReferenceValue")

// ErrReferenceVersion: the value's version field is a later
// PayloadReferenceValue version than this Ferry reads (1 to
// maxLaterVersion: a Ferry upgraded before its readers wrote it), where a
// larger or negative one is not a reference at all. It wraps
// ErrCorruptReference; the proxy answers it KAFKA_STORAGE_ERROR
// (retriable: readable once the reader is upgraded), not CORRUPT_MESSAGE.
var ErrReferenceVersion = fmt.Errorf("%w: a later version than this Ferry reads", ErrCorruptReference)

// maxLaterVersion bounds the versions ErrReferenceVersion takes for a
// later one: value bytes that are no reference (JSON, text) start with a
// far larger int16.
const maxLaterVersion = 255

// AppendTo appends the version-0 encoding of r to dst. It fails when a field
// is longer than a Kafka STRING allows (32767 bytes) or is not UTF-8, or when
// fullPayloadPath is empty (DecodeReference refuses that too).
func (r PayloadReferenceValue) AppendTo(dst []byte) ([]byte, error) {
	for _, f := range [...]struct{ name, v string }{{"fullPayloadPath", r.FullPayloadPath}, {"payloadStoreClass", r.PayloadStoreClass}} {
		if len(f.v) > math.MaxInt16 {
			return nil, fmt.Errorf("PayloadReferenceValue.%s is %d bytes, a STRING holds at most %d", f.name, len(f.v), math.MaxInt16)
		}
		if !utf8.ValidString(f.v) {
			return nil, fmt.Errorf("PayloadReferenceValue.%s is not UTF-8", f.name)
		}
	}
	if r.FullPayloadPath == "" {
		return nil, errors.New("PayloadReferenceValue.fullPayloadPath is empty")
	}
	dst = kbin.AppendInt16(dst, ReferenceVersion)
	dst = kbin.AppendString(dst, r.FullPayloadPath)
	dst = kbin.AppendString(dst, r.PayloadStoreClass)
	return dst, nil
}

// DecodeReference decodes a PayloadReferenceValue. It returns an error
// wrapping ErrCorruptReference when b is truncated, has trailing bytes, a
// negative (null) string length, invalid UTF-8, an empty path, or a version
// other than 0. It never panics, whatever b holds.
func DecodeReference(b []byte) (PayloadReferenceValue, error) {
	rd := kbin.Reader{Src: b}
	v := rd.Int16()
	if !rd.Ok() {
		return PayloadReferenceValue{}, fmt.Errorf("%w: %d bytes, too short for a version", ErrCorruptReference, len(b))
	}
	if v > ReferenceVersion && v <= maxLaterVersion {
		return PayloadReferenceValue{}, fmt.Errorf("%w: version %d, this Ferry reads version %d", ErrReferenceVersion, v, ReferenceVersion)
	}
	if v != ReferenceVersion {
		return PayloadReferenceValue{}, fmt.Errorf("%w: %d bytes starting %s, not a version-%d reference", ErrCorruptReference, len(b), start(b), ReferenceVersion)
	}
	var r PayloadReferenceValue
	for _, f := range [...]struct {
		name string
		dst  *string
	}{{"fullPayloadPath", &r.FullPayloadPath}, {"payloadStoreClass", &r.PayloadStoreClass}} {
		*f.dst = rd.String()
		if !rd.Ok() {
			return PayloadReferenceValue{}, fmt.Errorf("%w: %s truncated or null", ErrCorruptReference, f.name)
		}
		if !utf8.ValidString(*f.dst) {
			return PayloadReferenceValue{}, fmt.Errorf("%w: %s is not UTF-8", ErrCorruptReference, f.name)
		}
	}
	if len(rd.Src) != 0 {
		return PayloadReferenceValue{}, fmt.Errorf("%w: %d trailing bytes", ErrCorruptReference, len(rd.Src))
	}
	if r.FullPayloadPath == "" {
		return PayloadReferenceValue{}, fmt.Errorf("%w: empty fullPayloadPath", ErrCorruptReference)
	}
	return r, nil
}

// start quotes the first bytes of b for an error message.
func start(b []byte) string {
	if len(b) > 16 {
		return fmt.Sprintf("%q…", b[:16])
	}
	return fmt.Sprintf("%q", b)
}
