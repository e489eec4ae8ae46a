package envelope

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
)

// RecordAAD binds a sealed record value or header value to its topic and to
// the field it was sealed for ("value", or "header:" and the header's
// name), so that it cannot be moved to another topic or field.
type RecordAAD struct {
	Topic string
	Field string
}

// Record overhead beyond the wrapped key: the fixed header, a 12-byte nonce
// and a 16-byte tag.
const recordOverhead = fixedHeaderBytes + 12 + 16

// SealRecord appends to dst the sealed form of plain (docs/FORMAT.md §9.3):
// the header with the scope's data key (scope is the topic; a KMS call
// only when a new data key is due), a random 12-byte nonce, and the
// AES-256-GCM ciphertext with its tag. Errors wrap ErrKMS or ErrDecryptOnly.
func (k *Keyring) SealRecord(ctx context.Context, dst, plain []byte, a RecordAAD) ([]byte, error) {
	dk, err := k.sealKey(ctx, a.Topic)
	if err != nil {
		return nil, err
	}
	var nonce [12]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	return sealRecord(dst, dk, nonce[:], plain, a), nil
}

// sealRecord is SealRecord with the data key and nonce given.
func sealRecord(dst []byte, dk dataKey, nonce, plain []byte, a RecordAAD) []byte {
	h := header{alg: AlgAES256GCM, kek: dk.kek, wrapped: dk.wrapped}
	start := len(dst)
	dst = h.appendTo(dst)
	hb := dst[start:]
	dst = append(dst, nonce...)
	return dk.gcm.Seal(dst, nonce, plain, aad(recordLabel, hb, a.Topic, a.Field))
}

// SealedRecordSize is the size of SealRecord's output for plain bytes and a
// wrapped key of wrapped bytes.
func SealedRecordSize(plain, wrapped int) int { return recordOverhead + wrapped + plain }

// OpenRecord appends to dst the plaintext of sealed, a SealRecord output
// bound to a. Errors: ErrNotSealed, ErrFormat, ErrUnknownKey, ErrKMS,
// ErrAuthentication.
func (k *Keyring) OpenRecord(ctx context.Context, dst, sealed []byte, a RecordAAD) ([]byte, error) {
	h, n, err := parseFixed(sealed)
	if err != nil {
		return nil, err
	}
	if h.alg != AlgAES256GCM {
		return nil, fmt.Errorf("%w: algorithm %d is not a record's", ErrFormat, h.alg)
	}
	if len(sealed) < fixedHeaderBytes+n+12+16 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than its header, nonce and tag", ErrFormat, len(sealed))
	}
	h.wrapped = sealed[fixedHeaderBytes : fixedHeaderBytes+n]
	o, err := k.openKey(ctx, h.kek, h.wrapped)
	if err != nil {
		return nil, err
	}
	gcm := o.gcm
	hb := sealed[:fixedHeaderBytes+n]
	nonce := sealed[len(hb) : len(hb)+12]
	out, err := gcm.Open(dst, nonce, sealed[len(hb)+12:], aad(recordLabel, hb, a.Topic, a.Field))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAuthentication, err)
	}
	return out, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}
