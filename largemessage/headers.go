package largemessage

import (
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Record header names. HeaderLargeMessage is KIP-1159's; the rest are Ferry
// extensions that KIP-only readers can ignore (docs/FORMAT.md).
const (
	// HeaderLargeMessage = "true" marks a value that is a PayloadReferenceValue.
	HeaderLargeMessage = "large-message"
	// HeaderLargeMessageKey = "true" marks a key that is a PayloadReferenceValue.
	HeaderLargeMessageKey = "large-message-key"

	// HeaderPayloadSize is the payload's size in bytes, decimal ASCII.
	HeaderPayloadSize = "ferry.payload.size"
	// HeaderPayloadSHA256 is the payload's SHA-256, 64 lowercase hex digits.
	HeaderPayloadSHA256 = "ferry.payload.sha256"
	// HeaderPayloadMetadata is the store's custom metadata (KIP-917), raw
	// bytes; present only when the store returned some.
	HeaderPayloadMetadata = "ferry.payload.metadata"
	// HeaderPayloadCRC32C is the CRC-32C (Castagnoli) of the payload's
	// bytes as the client sent them (the plaintext value), 8 lowercase hex
	// digits. With it the proxy can write a fetched batch's CRC before it
	// has read the payload, and so stream the payload from the store to the
	// client (#19). Optional: a reference without it is resolved in memory.
	HeaderPayloadCRC32C = "ferry.payload.crc32c"

	// The same three facts for an offloaded key.
	HeaderKeyPayloadSize     = "ferry.key.payload.size"
	HeaderKeyPayloadSHA256   = "ferry.key.payload.sha256"
	HeaderKeyPayloadMetadata = "ferry.key.payload.metadata"
)

// side is which part of a record a header set describes.
type side struct {
	name                        string // "key" or "value"
	marker, size, sha, metadata string
	crc                         string // "" for the key: keys are never streamed
}

var (
	valueSide = side{"value", HeaderLargeMessage, HeaderPayloadSize, HeaderPayloadSHA256, HeaderPayloadMetadata, HeaderPayloadCRC32C}
	keySide   = side{"key", HeaderLargeMessageKey, HeaderKeyPayloadSize, HeaderKeyPayloadSHA256, HeaderKeyPayloadMetadata, ""}
)

// IsOffloaded reports whether rec's value carries a PayloadReferenceValue
// (header large-message: true).
func IsOffloaded(rec *kgo.Record) bool { return marked(rec.Headers, HeaderLargeMessage) }

// IsKeyOffloaded reports whether rec's key carries a PayloadReferenceValue
// (header large-message-key: true).
func IsKeyOffloaded(rec *kgo.Record) bool { return marked(rec.Headers, HeaderLargeMessageKey) }

func marked(hs []kgo.RecordHeader, name string) bool {
	for _, h := range hs {
		if h.Key == name && string(h.Value) == "true" {
			return true
		}
	}
	return false
}

func header(hs []kgo.RecordHeader, name string) ([]byte, bool) {
	for _, h := range hs {
		if h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

// withoutSide returns hs without the headers of s (in place).
func withoutSide(hs []kgo.RecordHeader, s side) []kgo.RecordHeader {
	out := hs[:0]
	for _, h := range hs {
		switch h.Key {
		case s.marker, s.size, s.sha, s.metadata:
			continue
		}
		if s.crc != "" && h.Key == s.crc {
			continue
		}
		out = append(out, h)
	}
	return out
}

// sideHeaders are the headers an offloaded side adds; crc (the value
// side's only; nil: not known) is the payload's CRC-32C.
func sideHeaders(s side, size int64, sha [32]byte, crc *uint32, metadata []byte) []kgo.RecordHeader {
	hs := []kgo.RecordHeader{
		{Key: s.marker, Value: []byte("true")},
		{Key: s.size, Value: strconv.AppendInt(nil, size, 10)},
		{Key: s.sha, Value: hex.AppendEncode(nil, sha[:])},
	}
	if crc != nil && s.crc != "" {
		hs = append(hs, kgo.RecordHeader{Key: s.crc, Value: fmt.Appendf(nil, "%08x", *crc)})
	}
	if len(metadata) > 0 {
		hs = append(hs, kgo.RecordHeader{Key: s.metadata, Value: metadata})
	}
	return hs
}

// expected reads the size and digest headers of s; ok is false when a
// KIP-only producer wrote the record without them.
func expected(hs []kgo.RecordHeader, s side) (size int64, sha []byte, ok bool, err error) {
	sv, hasSize := header(hs, s.size)
	dv, hasSHA := header(hs, s.sha)
	if !hasSize && !hasSHA {
		return 0, nil, false, nil
	}
	if !hasSize || !hasSHA {
		return 0, nil, false, fmt.Errorf("%w: only one of %s and %s is present", ErrCorruptReference, s.size, s.sha)
	}
	size, err = strconv.ParseInt(string(sv), 10, 64)
	if err != nil || size < 0 || len(sv) == 0 || sv[0] < '0' || sv[0] > '9' {
		return 0, nil, false, fmt.Errorf("%w: header %s=%q is not a size", ErrCorruptReference, s.size, sv)
	}
	sha, err = hex.DecodeString(string(dv))
	if err != nil || len(sha) != 32 || hex.EncodeToString(sha) != string(dv) { // lowercase only, as docs/FORMAT.md says
		return 0, nil, false, fmt.Errorf("%w: header %s=%q is not a SHA-256", ErrCorruptReference, s.sha, dv)
	}
	return size, sha, true, nil
}

// PayloadCRC32C returns the CRC-32C of rec's value payload from its
// ferry.payload.crc32c header; ok is false when the header is absent or
// not 8 lowercase hex digits (the value is then not streamed).
func PayloadCRC32C(rec *kgo.Record) (crc uint32, ok bool) {
	v, has := header(rec.Headers, HeaderPayloadCRC32C)
	if !has || len(v) != 8 {
		return 0, false
	}
	for _, c := range v {
		switch {
		case c >= '0' && c <= '9':
			crc = crc<<4 | uint32(c-'0')
		case c >= 'a' && c <= 'f':
			crc = crc<<4 | uint32(c-'a'+10)
		default:
			return 0, false
		}
	}
	return crc, true
}

// WithoutValueHeaders returns hs without the headers Ferry adds to an
// offloaded value (in place): the record as produced, once its value is
// put back.
func WithoutValueHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader { return withoutSide(hs, valueSide) }
