package envelope

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

// FuzzOpen feeds arbitrary bytes to OpenRecord and OpenStream (what a
// record value produced straight to the broker, or an object planted in a
// bucket, can hold): neither panics, neither returns plaintext for bytes it
// did not seal, and every error is one of the package's.
func FuzzOpen(f *testing.F) {
	k, err := OpenKeyring(context.Background(), Config{KeyURL: "base64key://AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="})
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	ra := RecordAAD{Topic: "t", Field: "value"}
	pa := PayloadAAD{Topic: "t", Key: "t/00/x"}
	rec, _ := k.SealRecord(ctx, nil, []byte("hello"), ra)
	s, _ := k.NewStreamSealer(ctx, "t")
	var obj bytes.Buffer
	w, _ := s.NewWriter(&obj, pa)
	w.Write([]byte("hello, object"))
	w.Close()
	f.Add(rec)
	f.Add(obj.Bytes())
	f.Add([]byte(Magic))
	f.Add(append([]byte(Magic), 1, 1, 0, 0, 16, 0))
	known := []error{ErrNotSealed, ErrFormat, ErrUnknownKey, ErrKMS, ErrAuthentication}
	typed := func(err error) bool {
		for _, e := range known {
			if errors.Is(err, e) {
				return true
			}
		}
		return false
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// Only the seeds were sealed under this KEK (a worker process
		// seals its own copies, with other data keys): anything else that
		// opens is a forgery.
		if got, err := k.OpenRecord(ctx, nil, b, ra); err == nil {
			if string(got) != "hello" {
				t.Fatalf("OpenRecord opened bytes it did not seal: %q", got)
			}
		} else if !typed(err) {
			t.Fatalf("OpenRecord: untyped error %v", err)
		}
		r, err := k.OpenStream(ctx, bytes.NewReader(b), pa)
		if err != nil {
			if !typed(err) {
				t.Fatalf("OpenStream: untyped error %v", err)
			}
			return
		}
		got, err := io.ReadAll(io.LimitReader(r, 1<<20))
		if err == nil && string(got) != "hello, object" {
			t.Fatalf("OpenStream opened bytes it did not seal: %q", got)
		}
		if err != nil && !typed(err) {
			t.Fatalf("OpenStream read: untyped error %v", err)
		}
	})
}
