package envelope

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/tink-crypto/tink-go/v2/streamingaead/subtle"
)

// Attack (security review of issue #13): Keyring.Close zeroes the cached
// data keys in place (clear(d.key)), but a StreamSealer handed out before
// Close shares that slice (sealKey returns a copy of the struct, not of the
// key). A sealer whose NewWriter runs after Close — a publish in flight
// while its store is closed: the sealing goroutine of payloadstore.Encrypted
// calls NewWriter only when the store first reads the body — seals the
// object under the all-zero data key while its header carries the real
// wrapped key. The object is then readable by anyone (the zero key, the
// salt in the header and the AAD, which is the object's own key, are all
// public) and never opens with the real key.
//
// Sealing after Close must fail, or at least never use a key anyone knows.
func TestAttackEncSealerAfterCloseUsesZeroKey(t *testing.T) {
	ctx := context.Background()
	k, err := OpenKeyring(ctx, Config{KeyURL: testKeyURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	a := PayloadAAD{Topic: "orders", Key: "orders/3a/5f0c6a3e-1b0e-4c1a-9d8e-2f4b7c6d9e01"}
	s, err := k.NewStreamSealer(ctx, a.Topic)
	if err != nil {
		t.Fatal(err)
	}
	k.Close() // e.g. the store closed while this publish is in flight

	var buf bytes.Buffer
	w, err := s.NewWriter(&buf, a)
	if err != nil {
		return // refusing is fine
	}
	plain := []byte("card=4111111111111111; the secret the bucket reader must not see")
	if _, err := w.Write(plain); err != nil {
		return
	}
	if err := w.Close(); err != nil {
		return
	}
	sealed := buf.Bytes()

	// Open it as an attacker would: the all-zero data key.
	h, n, err := parseFixed(sealed)
	if err != nil {
		t.Fatal(err)
	}
	hl := fixedHeaderBytes + n
	h.wrapped = sealed[fixedHeaderBytes:hl]
	zero := make([]byte, 32)
	tk, err := subtle.NewAESGCMHKDF(zero, tinkHKDF, tinkKeyBytes, int(h.segment), 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tk.NewDecryptingReader(bytes.NewReader(sealed[hl:]), aad(payloadLabel, sealed[:hl], a.Topic, a.Key))
	if err == nil {
		if got, err := io.ReadAll(r); err == nil {
			t.Fatalf("an object sealed by a sealer used after Keyring.Close opens with the all-zero data key: %q", got)
		}
	}
}
