package envelope

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
// AES-256-GCM ciphertext with its tag. With room in dst for
// SealedRecordSize bytes it allocates nothing: the nonce is drawn into dst
// and the associated data built in a pooled buffer. Errors wrap ErrKMS or
// ErrDecryptOnly.
func (k *Keyring) SealRecord(ctx context.Context, dst, plain []byte, a RecordAAD) ([]byte, error) {
	dk, err := k.sealKey(ctx, a.Topic)
	if err != nil {
		return nil, err
	}
	return sealRecord(dst, dk, rand.Read, plain, a)
}

// sealRecord is SealRecord with the data key given and the nonce written
// into its place by fill (rand.Read; the format test's fixed nonce).
func sealRecord(dst []byte, dk dataKey, fill func([]byte) (int, error), plain []byte, a RecordAAD) ([]byte, error) {
	h := header{alg: AlgAES256GCM, kek: dk.kek, wrapped: dk.wrapped}
	start := len(dst)
	dst = h.appendTo(dst)
	hl := len(dst)
	dst = append(dst, make([]byte, 12)...) // no allocation: append's idiom for n zero bytes
	nonce := dst[hl:]
	if _, err := fill(nonce); err != nil {
		return nil, err
	}
	if ad := dk.memo.get(a, dst[start:hl]); ad != nil {
		return dk.gcm.Seal(dst, nonce, plain, ad), nil
	}
	ad := aadPool.Get().(*[]byte)
	*ad = appendAAD((*ad)[:0], recordLabel, dst[start:hl], a.Topic, a.Field)
	dk.memo.put(a, *ad)
	dst = dk.gcm.Seal(dst, nonce, plain, *ad)
	putAAD(ad)
	return dst, nil
}

// SealedRecordSize is the size of SealRecord's output for plain bytes and a
// wrapped key of wrapped bytes.
func SealedRecordSize(plain, wrapped int) int { return recordOverhead + wrapped + plain }

// OpenedRecordSize is the size of OpenRecord's output for sealed bytes: the
// sealed length less its header, nonce and tag (len(sealed) when the
// header does not parse, which OpenRecord then refuses).
func OpenedRecordSize(sealed []byte) int {
	_, n, err := parseFixed(sealed)
	if err != nil || len(sealed) < recordOverhead+n {
		return len(sealed)
	}
	return len(sealed) - recordOverhead - n
}

// OpenRecord appends to dst the plaintext of sealed, a SealRecord output
// bound to a; with room in dst for the plaintext (len(sealed) at most) it
// allocates nothing once the data key is cached. Errors: ErrNotSealed, ErrFormat, ErrUnknownKey, ErrKMS,
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
	var out []byte
	if ad := o.memo.get(a, hb); ad != nil {
		out, err = gcm.Open(dst, nonce, sealed[len(hb)+12:], ad)
	} else {
		ad := aadPool.Get().(*[]byte)
		*ad = appendAAD((*ad)[:0], recordLabel, hb, a.Topic, a.Field)
		o.memo.put(a, *ad)
		out, err = gcm.Open(dst, nonce, sealed[len(hb)+12:], *ad)
		putAAD(ad)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAuthentication, err)
	}
	return out, nil
}

// aadPool holds the buffers a record's associated data is built in: the
// AEAD interface makes any buffer passed to it escape, so one made per
// record would be an allocation per record.
var aadPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// putAAD gives a buffer back to aadPool, unless a long topic or header
// name grew it past what is worth keeping.
func putAAD(b *[]byte) {
	if cap(*b) <= 4<<10 {
		aadPool.Put(b)
	}
}

// aadMemo keeps the associated data of a data key's first aadSlots
// (topic, field) pairs. A record's associated data is its topic, its field
// and its header (recordLabel, appendAAD), and one data key's records all
// have the same header: every record of a topic's field sealed or opened
// with that key has the same associated data, built once here instead of
// once per record. A nil memo keeps nothing.
type aadMemo struct {
	slots [aadSlots]atomic.Pointer[aadEntry]
}

// aadSlots: the value and a few sealed headers of one topic.
const aadSlots = 4

type aadEntry struct {
	topic, field string
	ad           []byte // read only: shared by every caller
}

// get returns the associated data of a for header hb, or nil when it is
// not kept. The header is compared too: a record claiming the key with
// other header bytes is bound to its own.
func (m *aadMemo) get(a RecordAAD, hb []byte) []byte {
	if m == nil {
		return nil
	}
	for i := range m.slots {
		e := m.slots[i].Load()
		if e == nil {
			return nil
		}
		if e.topic == a.Topic && e.field == a.Field && len(e.ad) >= len(hb) && bytes.Equal(e.ad[len(e.ad)-len(hb):], hb) {
			return e.ad
		}
	}
	return nil
}

// put keeps a copy of ad, the associated data of a, in a free slot (none
// left: it is not kept).
func (m *aadMemo) put(a RecordAAD, ad []byte) {
	if m == nil {
		return
	}
	e := &aadEntry{topic: strings.Clone(a.Topic), field: strings.Clone(a.Field), ad: bytes.Clone(ad)}
	for i := range m.slots {
		if m.slots[i].CompareAndSwap(nil, e) {
			return
		}
	}
}

func newGCM(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}
