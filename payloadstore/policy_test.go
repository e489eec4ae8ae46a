package payloadstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferrykit/ferry/payloadstore"
)

// A payload whose bytes changed after it was hashed (a file rewritten
// during the upload) must not be left in the store under the old digest.
func TestPublishRefusesChangedPayload(t *testing.T) {
	dir := t.TempDir()
	fs, err := payloadstore.NewFileStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := payloadstore.Wrap(fs, payloadstore.DefaultPolicy)
	p := payloadstore.BytesPayload([]byte("the bytes that were hashed"))
	p.Body = bytes.NewReader([]byte("the bytes that were changed"))
	p.ID = "changed"
	_, err = s.Publish(context.Background(), "t", p)
	if !errors.Is(err, payloadstore.ErrPayloadChanged) {
		t.Fatalf("got %v, want ErrPayloadChanged", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "t", "changed")); !os.IsNotExist(err) {
		t.Fatalf("the changed payload was left in the store: %v", err)
	}
	// The same store publishes an unchanged payload.
	ok := payloadstore.BytesPayload([]byte("unchanged"))
	resp, err := s.Publish(context.Background(), "t", ok)
	if err != nil {
		t.Fatal(err)
	}
	got, err := payloadstore.DownloadBytes(context.Background(), s, resp.FullPayloadPath)
	if err != nil || string(got) != "unchanged" {
		t.Fatalf("download: %q %v", got, err)
	}
}

// A consumer's store (ReadOnly) must exist: a mistyped URL fails and
// creates nothing; an existing directory opens.
func TestReadOnlyOpenDoesNotCreate(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "typo")
	if _, err := payloadstore.Open(context.Background(), "file://"+missing, payloadstore.Options{ReadOnly: true}); err == nil {
		t.Fatal("opened a store directory that does not exist")
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("the read-only open created %s", missing)
	}
	s, err := payloadstore.Open(context.Background(), "file://"+filepath.Dir(missing), payloadstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
