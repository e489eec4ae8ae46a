package envelope

import (
	"encoding/binary"
	"fmt"
)

// Magic starts every sealed object and sealed record value: the 8 ASCII
// bytes "FERRYENC".
const Magic = "FERRYENC"

// HeaderVersion is the only header version.
const HeaderVersion = 1

// Algorithms, the byte after the version.
const (
	// AlgStreamAES256GCMHKDF: a sealed object; the rest of the object is
	// a Tink streaming AEAD AES256_GCM_HKDF (HKDF-SHA256, 32-byte derived
	// keys) ciphertext with the header's segment size.
	AlgStreamAES256GCMHKDF = 1
	// AlgAES256GCM: a sealed record value or header; a 12-byte nonce,
	// then AES-256-GCM ciphertext and its 16-byte tag.
	AlgAES256GCM = 2
)

// Segment sizes a sealed object may declare, in bytes of ciphertext.
const (
	// DefaultSegmentBytes is what Ferry writes: 256 KiB, so that a
	// stream holds about 1 MiB of buffers whatever its size.
	DefaultSegmentBytes = 256 << 10
	MinSegmentBytes     = 4 << 10
	MaxSegmentBytes     = 8 << 20
)

// header is the fixed start of sealed bytes (docs/FORMAT.md §9.1):
//
//	magic        8 bytes  "FERRYENC"
//	version      1 byte   1
//	algorithm    1 byte   AlgStreamAES256GCMHKDF or AlgAES256GCM
//	segment      4 bytes  big-endian ciphertext segment size (0 for records)
//	key id       8 bytes  KeyID of the KEK
//	wrapped len  2 bytes  big-endian, 1..MaxWrappedKeyBytes
//	wrapped key  that many bytes: the data key as the KMS wrapped it
type header struct {
	alg     byte
	segment uint32
	kek     KeyID
	wrapped []byte
}

const fixedHeaderBytes = len(Magic) + 1 + 1 + 4 + 8 + 2

func (h header) appendTo(dst []byte) []byte {
	dst = append(dst, Magic...)
	dst = append(dst, HeaderVersion, h.alg)
	dst = binary.BigEndian.AppendUint32(dst, h.segment)
	dst = append(dst, h.kek[:]...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(h.wrapped)))
	return append(dst, h.wrapped...)
}

func (h header) len() int { return fixedHeaderBytes + len(h.wrapped) }

// IsSealed reports whether b starts with Magic: whether it is (or claims to
// be) sealed by this package. b may be just the first bytes.
func IsSealed(b []byte) bool {
	return len(b) >= len(Magic) && string(b[:len(Magic)]) == Magic
}

// parseFixed parses the fixed part of a header from b (at least
// fixedHeaderBytes long) and returns it with the wrapped key's length.
func parseFixed(b []byte) (header, int, error) {
	if !IsSealed(b) {
		return header{}, 0, ErrNotSealed
	}
	if len(b) < fixedHeaderBytes {
		return header{}, 0, fmt.Errorf("%w: %d bytes, the header alone is %d", ErrFormat, len(b), fixedHeaderBytes)
	}
	if v := b[8]; v != HeaderVersion {
		err := ErrFormat
		if v > HeaderVersion {
			err = ErrVersion
		}
		return header{}, 0, fmt.Errorf("%w: version %d, this Ferry reads version %d", err, v, HeaderVersion)
	}
	h := header{alg: b[9], segment: binary.BigEndian.Uint32(b[10:14])}
	copy(h.kek[:], b[14:22])
	n := int(binary.BigEndian.Uint16(b[22:24]))
	if n == 0 || n > MaxWrappedKeyBytes {
		return header{}, 0, fmt.Errorf("%w: wrapped data key of %d bytes (1 to %d)", ErrFormat, n, MaxWrappedKeyBytes)
	}
	switch h.alg {
	case AlgStreamAES256GCMHKDF:
		if h.segment < MinSegmentBytes || h.segment > MaxSegmentBytes {
			return header{}, 0, fmt.Errorf("%w: segment of %d bytes (%d to %d)", ErrFormat, h.segment, MinSegmentBytes, MaxSegmentBytes)
		}
	case AlgAES256GCM:
		if h.segment != 0 {
			return header{}, 0, fmt.Errorf("%w: segment %d in a record header (must be 0)", ErrFormat, h.segment)
		}
	default:
		return header{}, 0, fmt.Errorf("%w: algorithm %d", ErrVersion, h.alg)
	}
	return h, n, nil
}

// aad is the associated data of sealed bytes: a label, the caller's binding
// fields each as a 4-byte big-endian length and its bytes, then the whole
// header. Binding the header means a wrapped key or key id swapped in from
// elsewhere fails to authenticate too.
func aad(label string, h []byte, fields ...string) []byte {
	n := len(label) + 1 + len(h)
	for _, f := range fields {
		n += 4 + len(f)
	}
	return appendAAD(make([]byte, 0, n), label, h, fields...)
}

// appendAAD appends aad's bytes to b.
func appendAAD(b []byte, label string, h []byte, fields ...string) []byte {
	b = append(b, label...)
	b = append(b, 0)
	for _, f := range fields {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return append(b, h...)
}
