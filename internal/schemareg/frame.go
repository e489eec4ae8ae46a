// Package schemareg checks Confluent-framed record keys and values against a
// Confluent Schema Registry (its REST API, via franz-go's pkg/sr): the
// framing, the schema id's registration under the record's subject, and the
// payload's decoding under the schema (Avro, JSON Schema, Protobuf). It is
// the engine of the proxy's validate-schema interceptor.
package schemareg

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors, each wrapped with the record's detail.
var (
	// ErrNotFramed: the bytes do not start with Confluent's wire format
	// (magic byte 0, then a 4-byte big-endian schema id).
	ErrNotFramed = errors.New("not in the Confluent wire format")
	// ErrUnknownSchema: the registry knows no schema with the id, or the
	// subject has not registered it.
	ErrUnknownSchema = errors.New("schema id not registered under the subject")
	// ErrInvalidPayload: the payload does not decode under its schema, or
	// goes over a decoding bound.
	ErrInvalidPayload = errors.New("payload does not decode under its schema")
	// ErrBadSchema: the registry's schema cannot be used (it does not
	// parse, is too large, or uses references, which are not supported).
	ErrBadSchema = errors.New("unusable schema")
	// ErrUnavailable: the registry could not be reached or answered with a
	// server error or a timeout: a transient fault.
	ErrUnavailable = errors.New("schema registry unavailable")
)

// magicByte is the first byte of Confluent's wire format.
const magicByte = 0

// maxMessageIndexes bounds the message-index array of the Protobuf framing
// (a nesting path: no real schema nests messages this deep).
const maxMessageIndexes = 100

// Frame is a parsed Confluent wire-format record side.
type Frame struct {
	// ID is the schema id (a 4-byte big-endian signed int on the wire).
	ID int
	// Indexes is Protobuf's message-index path (empty means the first
	// message, as Confluent's [0] shorthand); nil for other formats.
	Indexes []int
	// Payload is what follows the framing.
	Payload []byte
}

// ParseFrame reads Confluent's framing: magic byte 0, the schema id and, when
// protobuf is set, the message indexes (a zigzag varint count, then that many
// zigzag varints; a count of 0 means [0]). Errors wrap ErrNotFramed.
func ParseFrame(b []byte, protobuf bool) (Frame, error) {
	if len(b) < 5 {
		return Frame{}, fmt.Errorf("%w: %d bytes, fewer than the 5 of the magic byte and schema id", ErrNotFramed, len(b))
	}
	if b[0] != magicByte {
		return Frame{}, fmt.Errorf("%w: magic byte %d, want 0", ErrNotFramed, b[0])
	}
	f := Frame{ID: int(int32(binary.BigEndian.Uint32(b[1:5]))), Payload: b[5:]}
	if !protobuf {
		return f, nil
	}
	idx, rest, err := parseIndexes(f.Payload)
	if err != nil {
		return Frame{}, err
	}
	f.Indexes, f.Payload = idx, rest
	return f, nil
}

func parseIndexes(b []byte) ([]int, []byte, error) {
	n, k := binary.Varint(b)
	if k <= 0 {
		return nil, nil, fmt.Errorf("%w: the Protobuf message-index count is not a varint", ErrNotFramed)
	}
	b = b[k:]
	if n == 0 {
		return []int{0}, b, nil
	}
	if n < 0 || n > maxMessageIndexes {
		return nil, nil, fmt.Errorf("%w: Protobuf message-index count %d, not between 0 and %d", ErrNotFramed, n, maxMessageIndexes)
	}
	idx := make([]int, n)
	for i := range idx {
		v, k := binary.Varint(b)
		if k <= 0 || v < 0 || v > 1<<30 {
			return nil, nil, fmt.Errorf("%w: Protobuf message index %d is not a varint between 0 and 2^30", ErrNotFramed, i)
		}
		idx[i], b = int(v), b[k:]
	}
	return idx, b, nil
}

// AppendFrame writes Confluent's framing for id (and, for Protobuf,
// indexes: nil for other formats, [0] written as the one-byte shorthand)
// followed by payload: the inverse of ParseFrame, for tests and producers.
func AppendFrame(dst []byte, id int, indexes []int, payload []byte) []byte {
	dst = append(dst, magicByte)
	dst = binary.BigEndian.AppendUint32(dst, uint32(int32(id)))
	if indexes != nil {
		if len(indexes) == 1 && indexes[0] == 0 {
			dst = binary.AppendVarint(dst, 0)
		} else {
			dst = binary.AppendVarint(dst, int64(len(indexes)))
			for _, i := range indexes {
				dst = binary.AppendVarint(dst, int64(i))
			}
		}
	}
	return append(dst, payload...)
}
