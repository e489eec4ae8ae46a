package envelope

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// Security review of issue #13 (held): hostile sealed headers, as a
// writer with direct broker access or bucket access would forge them, are
// refused with envelope's typed errors and never panic: a huge or zero
// wrapped-key length, an unknown version or algorithm, segment sizes just
// out of bounds (and a record's non-zero segment), truncated headers and
// bodies, a record header on an object and the reverse, a key id that is
// not configured. Segment sizes at the bounds parse (and then fail to
// authenticate).
func TestAttackEncHostileHeaders(t *testing.T) {
	ctx := context.Background()
	keyURL := testKeyURL(t)
	k := openTest(t, Config{KeyURL: keyURL})
	id, _ := KeyIDOf(keyURL)
	a := PayloadAAD{Topic: "orders", Key: "orders/00/x"}
	ra := RecordAAD{Topic: "orders", Field: "value"}
	good, _ := seal(t, k, bytes.Repeat([]byte("x"), 1000), a)
	goodRec, err := k.SealRecord(ctx, nil, []byte("hello"), ra)
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(version, alg byte, seg uint32, kid KeyID, wlen uint16, rest int) []byte {
		b := append([]byte(Magic), version, alg)
		b = binary.BigEndian.AppendUint32(b, seg)
		b = append(b, kid[:]...)
		b = binary.BigEndian.AppendUint16(b, wlen)
		return append(b, make([]byte, rest)...)
	}
	cases := []struct {
		name string
		b    []byte
		want []error
	}{
		{"wrapped 65535, 10 bytes given", hdr(1, 1, DefaultSegmentBytes, id, 65535, 10), []error{ErrFormat}},
		{"wrapped 4097", hdr(1, 2, 0, id, 4097, 5000), []error{ErrFormat}},
		{"wrapped 0", hdr(1, 2, 0, id, 0, 100), []error{ErrFormat}},
		{"version 2", hdr(2, 1, DefaultSegmentBytes, id, 72, 200), []error{ErrFormat}},
		{"version 0", hdr(0, 2, 0, id, 72, 200), []error{ErrFormat}},
		{"algorithm 0", hdr(1, 0, 0, id, 72, 200), []error{ErrFormat}},
		{"algorithm 255", hdr(1, 255, DefaultSegmentBytes, id, 72, 200), []error{ErrFormat}},
		{"segment 4095", hdr(1, 1, MinSegmentBytes-1, id, 72, 200), []error{ErrFormat}},
		{"segment 8 MiB + 1", hdr(1, 1, MaxSegmentBytes+1, id, 72, 200), []error{ErrFormat}},
		{"segment 2^32-1", hdr(1, 1, 1<<32-1, id, 72, 200), []error{ErrFormat}},
		{"record with a segment", hdr(1, 2, 4096, id, 72, 200), []error{ErrFormat}},
		{"magic only", []byte(Magic), []error{ErrFormat}},
		{"fixed header cut", hdr(1, 1, DefaultSegmentBytes, id, 72, 0)[:20], []error{ErrFormat}},
		{"unknown key id", hdr(1, 2, 0, KeyID{1, 2, 3}, 72, 200), []error{ErrUnknownKey}},
		{"unknown key id (object)", hdr(1, 1, DefaultSegmentBytes, KeyID{1, 2, 3}, 72, 200), []error{ErrUnknownKey}},
		{"not sealed", []byte("FERRYENX and more bytes than a header needs"), []error{ErrNotSealed}},
		{"empty", nil, []error{ErrNotSealed}},
		{"real object, body cut", good[:len(good)-1], []error{ErrAuthentication}},
		{"real object, header only", good[:fixedHeaderBytes+72], []error{ErrAuthentication, ErrFormat}},
		{"real record, tag cut", goodRec[:len(goodRec)-1], []error{ErrAuthentication}},
		{"real record, nonce cut", goodRec[:fixedHeaderBytes+72+5], []error{ErrFormat}},
		{"real record as an object", goodRec, []error{ErrFormat}},
		{"real object as a record", good, []error{ErrFormat}},
	}
	// Segments at the bounds, with the real wrapped key: parse, then fail
	// to authenticate.
	for _, seg := range []uint32{MinSegmentBytes, MaxSegmentBytes} {
		b := append([]byte(nil), good...)
		binary.BigEndian.PutUint32(b[10:], seg)
		cases = append(cases, struct {
			name string
			b    []byte
			want []error
		}{"real object re-segmented", b, []error{ErrAuthentication}})
	}
	is := func(err error, want []error) bool {
		for _, w := range want {
			if w == nil && err == nil {
				return true
			}
			if errors.Is(err, w) {
				return true
			}
		}
		return false
	}
	for _, c := range cases {
		objErr := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s: OpenStream panicked: %v", c.name, r)
				}
			}()
			r, err := k.OpenStream(ctx, bytes.NewReader(c.b), a)
			if err != nil {
				return err
			}
			_, err = io.ReadAll(r)
			return err
		}()
		recErr := func() error {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s: OpenRecord panicked: %v", c.name, r)
				}
			}()
			_, err := k.OpenRecord(ctx, nil, c.b, ra)
			return err
		}()
		wantObj, wantRec := c.want, c.want
		switch c.name {
		case "real record as an object":
			wantRec = []error{nil}
		case "real object as a record":
			wantObj = []error{nil}
		case "unknown key id":
			wantObj = []error{ErrFormat}
		case "unknown key id (object)":
			wantRec = []error{ErrFormat}
		case "real record, tag cut", "real record, nonce cut", "wrapped 4097", "wrapped 0", "algorithm 0", "version 0", "record with a segment":
			wantObj = []error{ErrFormat, ErrAuthentication, ErrNotSealed}
		case "real object, body cut", "real object, header only", "real object re-segmented", "wrapped 65535, 10 bytes given", "segment 4095", "segment 8 MiB + 1", "segment 2^32-1", "version 2", "algorithm 255", "fixed header cut":
			wantRec = []error{ErrFormat, ErrAuthentication}
		}
		if !is(objErr, wantObj) {
			t.Errorf("%s: OpenStream: %v, want one of %v", c.name, objErr, wantObj)
		}
		if !is(recErr, wantRec) {
			t.Errorf("%s: OpenRecord: %v, want one of %v", c.name, recErr, wantRec)
		}
		if len(c.b) >= FixedHeaderBytes && is(objErr, []error{ErrFormat}) {
			if _, err := PlainSizeOf(c.b, int64(len(c.b))); err == nil {
				t.Errorf("%s: PlainSizeOf accepted what OpenStream calls malformed", c.name)
			}
		}
	}
}
