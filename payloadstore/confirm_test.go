package payloadstore_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/payloadstore"
)

// Confirm on the file and mem stores: an object at its key is Present; one
// in a gc quarantine folder is copied back (and the folder's copy left for
// gc); one gone is published again by republish, or is ErrPayloadLost
// (wrapping ErrPayloadNotFound) without it.
func TestConfirm(t *testing.T) {
	ctx := context.Background()
	for name, s := range map[string]payloadstore.PayloadStore{
		"mem":  payloadstore.NewMemStore("confirm", nil),
		"file": openFile(t),
	} {
		t.Run(name, func(t *testing.T) {
			ops, err := payloadstore.Objects(s)
			if err != nil {
				t.Fatal(err)
			}
			body := []byte("the payload a record references")
			resp, err := payloadstore.PublishBytes(ctx, s, "orders", body)
			if err != nil {
				t.Fatal(err)
			}
			path := resp.FullPayloadPath
			key, err := ops.Root().Key(path)
			if err != nil {
				t.Fatal(err)
			}
			if c, err := payloadstore.Confirm(ctx, s, path, nil); err != nil || c != payloadstore.Present {
				t.Fatalf("object at its key: %v %v", c, err)
			}

			// gc quarantined it.
			qkey := "orders/.ferry-gc/q/20260101T000000.000000000Z-00000000/" + strings.TrimPrefix(key, "orders/")
			if err := ops.Move(ctx, key, qkey); err != nil {
				t.Fatal(err)
			}
			if c, err := payloadstore.Confirm(ctx, s, path, nil); err != nil || c != payloadstore.RestoredFromQuarantine {
				t.Fatalf("object in quarantine: %v %v", c, err)
			}
			if got, err := payloadstore.DownloadBytes(ctx, s, path); err != nil || !bytes.Equal(got, body) {
				t.Fatalf("after the copy back: %v", err)
			}
			if _, err := ops.Stat(ctx, qkey); err != nil {
				t.Fatalf("the quarantined copy is gc's to remove: %v", err)
			}

			// gc deleted it.
			if err := ops.Remove(ctx, qkey); err != nil {
				t.Fatal(err)
			}
			if err := ops.Remove(ctx, key); err != nil {
				t.Fatal(err)
			}
			_, err = payloadstore.Confirm(ctx, s, path, nil)
			if !errors.Is(err, payloadstore.ErrPayloadLost) || !errors.Is(err, payloadstore.ErrPayloadNotFound) {
				t.Fatalf("gone, no bytes: %v, want ErrPayloadLost", err)
			}
			republished := false
			c, err := payloadstore.Confirm(ctx, s, path, func(ctx context.Context) error {
				republished = true
				return ops.Put(ctx, key, body)
			})
			if err != nil || c != payloadstore.Republished || !republished {
				t.Fatalf("gone, with bytes: %v %v", c, err)
			}
			if got, err := payloadstore.DownloadBytes(ctx, s, path); err != nil || !bytes.Equal(got, body) {
				t.Fatalf("after republishing: %v", err)
			}
			if _, err := payloadstore.Confirm(ctx, s, "file:///elsewhere/orders/00/x", nil); !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Fatalf("a path outside the store: %v", err)
			}
		})
	}
}
