//go:build !ferry_nocloud

package payloadstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/payloadstore"
)

// blockingBody blocks its first Seek until release is closed, after
// signalling entered: the moment the sealing goroutine of an encrypted
// store has its sealer but has not yet called NewWriter.
type blockingBody struct {
	*bytes.Reader
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (b *blockingBody) Seek(off int64, whence int) (int64, error) {
	b.once.Do(func() { close(b.entered); <-b.release })
	return b.Reader.Seek(off, whence)
}

// Attack (security review of issue #13): an encrypted file store closed
// while a Publish is in flight (a producer shutting down, the proxy
// retiring a chain) commits and returns a reference to an object sealed
// under the all-zero data key: Keyring.Close zeroes the key slice the
// in-flight sealer shares. The publish reports success; the object never
// opens with the real key (a consumer gets ErrAuthentication: the payload is
// lost), and anyone who reads the bucket opens it with the zero key.
//
// A Publish racing Close must fail, not commit such an object.
func TestAttackEncPublishDuringCloseCommitsZeroKeyObject(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	key := randomKeyURL()
	open := func() payloadstore.PayloadStore {
		s, err := payloadstore.Open(ctx, "file://"+dir, payloadstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		k, err := envelope.OpenKeyring(ctx, envelope.Config{KeyURL: key})
		if err != nil {
			t.Fatal(err)
		}
		return payloadstore.Encrypted(s, payloadstore.Encryption{Keyring: k})
	}
	st := open()
	plain := bytes.Repeat([]byte("secret payload "), 1000)
	body := &blockingBody{Reader: bytes.NewReader(plain), entered: make(chan struct{}), release: make(chan struct{})}
	type result struct {
		resp payloadstore.PayloadResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := st.Publish(ctx, "orders", payloadstore.StreamPayload(body, int64(len(plain))))
		done <- result{resp, err}
	}()
	<-body.entered
	st.Close()
	close(body.release)
	res := <-done
	if res.err != nil {
		return // refused: fine
	}
	// The publish said it succeeded: the object must open with the key.
	st2 := open()
	defer st2.Close()
	rc, err := st2.Download(ctx, res.resp.FullPayloadPath)
	if err != nil {
		t.Fatalf("Publish during Close returned %s, which does not open: %v", res.resp.FullPayloadPath, err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		if errors.Is(err, envelope.ErrAuthentication) {
			t.Fatalf("Publish during Close succeeded, but its object does not authenticate under its own wrapped key (sealed under a zeroed data key): %v", err)
		}
		t.Fatal(err)
	}
	if !bytes.Equal(got, plain) {
		t.Fatal("wrong bytes")
	}
}
