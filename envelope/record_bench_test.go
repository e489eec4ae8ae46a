package envelope

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"testing"
)

// BenchmarkAES256GCM1KiB is the floor of sealing and opening a 1 KiB
// record: AES-256-GCM alone (Go's crypto/cipher, a 12-byte nonce and 16-byte
// tag, 40 bytes of associated data, as SealRecord uses), no header, no
// nonce drawn, no key lookup.
func BenchmarkAES256GCM1KiB(b *testing.B) {
	key := make([]byte, 32)
	rand.Read(key)
	blk, err := aes.NewCipher(key)
	if err != nil {
		b.Fatal(err)
	}
	gcm, err := cipher.NewGCM(blk)
	if err != nil {
		b.Fatal(err)
	}
	plain, nonce, ad := make([]byte, 1024), make([]byte, 12), make([]byte, 40)
	sealed := gcm.Seal(nil, nonce, plain, ad)
	dst := make([]byte, 0, len(sealed))
	b.Run("seal", func(b *testing.B) {
		b.SetBytes(int64(len(plain)))
		for b.Loop() {
			dst = gcm.Seal(dst[:0], nonce, plain, ad)
		}
	})
	b.Run("open", func(b *testing.B) {
		b.SetBytes(int64(len(plain)))
		for b.Loop() {
			if _, err := gcm.Open(dst[:0], nonce, sealed, ad); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRecord1KiB is SealRecord and OpenRecord of a 1 KiB value into a
// buffer with room (the encrypt interceptor's use): the AEAD plus the
// header, the nonce drawn, the associated data and the data key's lookup.
func BenchmarkRecord1KiB(b *testing.B) {
	ctx := context.Background()
	k := openTest(b, Config{KeyURL: testKeyURL(b)})
	plain := make([]byte, 1024)
	a := RecordAAD{Topic: "bench", Field: "value"}
	sealed, err := k.SealRecord(ctx, nil, plain, a)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, 0, len(sealed))
	b.Run("seal", func(b *testing.B) {
		b.SetBytes(int64(len(plain)))
		for b.Loop() {
			if dst, err = k.SealRecord(ctx, dst[:0], plain, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open", func(b *testing.B) {
		b.SetBytes(int64(len(plain)))
		for b.Loop() {
			if _, err := k.OpenRecord(ctx, dst[:0], sealed, a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
