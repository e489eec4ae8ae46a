package envelope

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"testing"
)

// failingReader gives the first n bytes of b, then fails with err (a store
// whose download was cut, throttled or reset part way).
type failingReader struct {
	b   []byte
	n   int
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, f.err
	}
	k := copy(p, f.b[:min(f.n, len(f.b))])
	k = min(k, len(p))
	f.b, f.n = f.b[k:], f.n-k
	return k, nil
}

// storeError is what a payload store's reader returns when its download
// fails mid-stream: its own error type, with no Timeout method, possibly
// wrapping the transport's io.ErrUnexpectedEOF.
type storeError struct{ err error }

func (e *storeError) Error() string { return "payload store download: " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// A source that fails part way (a cut connection, a throttled ranged GET,
// a reset) is the source's failure, not the ciphertext's: OpenStream and
// its reader return the source's error, never ErrAuthentication or
// ErrFormat, which say the bytes themselves are at fault (the proxy answers
// those with CORRUPT_MESSAGE, and an application may skip the record).
func TestOpenStreamSourceFaultIsNotCorruption(t *testing.T) {
	k := openTest(t, Config{KeyURL: testKeyURL(t)})
	a := PayloadAAD{Topic: "t", Key: "t/00/x"}
	plain := make([]byte, 3*DefaultSegmentBytes+123)
	rand.Read(plain)
	sealed, s := seal(t, k, plain, a)
	hl := s.HeaderBytes()
	for _, srcErr := range []error{
		io.ErrUnexpectedEOF,
		&storeError{io.ErrUnexpectedEOF},
		&storeError{errors.New("api error SlowDown: Please reduce your request rate (503)")},
		&storeError{errors.New("the object ended at byte 1048576, before the 4194321 bytes it had when the download began")},
	} {
		for _, at := range []int{fixedHeaderBytes - 3, fixedHeaderBytes + 2, hl + 5, hl + DefaultSegmentBytes + 7, len(sealed) - 1} {
			t.Run(fmt.Sprintf("%v/at %d", srcErr, at), func(t *testing.T) {
				r, err := k.OpenStream(context.Background(), &failingReader{b: bytes.Clone(sealed), n: at, err: srcErr}, a)
				if err == nil {
					_, err = io.Copy(io.Discard, r)
				}
				if err == nil || errors.Is(err, ErrAuthentication) || errors.Is(err, ErrFormat) || errors.Is(err, ErrNotSealed) {
					t.Fatalf("source failing after %d of %d bytes with %v: got %v; want the source's error, not a corrupt-ciphertext one", at, len(sealed), srcErr, err)
				}
				if !errors.Is(err, srcErr) {
					t.Fatalf("source failing with %v: got %v, which does not wrap it", srcErr, err)
				}
			})
		}
	}
	// A source that ends early without an error (the object itself is
	// short) is still ErrAuthentication or ErrFormat.
	for _, at := range []int{fixedHeaderBytes + 2, hl + 5, len(sealed) - 1} {
		_, err := open(k, sealed[:at], a)
		if !errors.Is(err, ErrAuthentication) && !errors.Is(err, ErrFormat) {
			t.Fatalf("object truncated at %d: %v, want ErrAuthentication or ErrFormat", at, err)
		}
	}
}
