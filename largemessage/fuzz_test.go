package largemessage_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ferrykit/ferry/largemessage"
)

// referenceSeeds are the doc's vectors (valid and invalid) and edge cases
// around every length and version boundary.
func referenceSeeds(f *testing.F) [][]byte {
	var seeds [][]byte
	if _, err := os.Stat(formatDoc); err == nil {
		fv := parseFormatDoc(f)
		for _, v := range fv.valid {
			seeds = append(seeds, v.enc)
		}
		for _, v := range fv.invalid {
			seeds = append(seeds, v.enc)
		}
	}
	enc := func(path, class string) []byte {
		b, err := largemessage.PayloadReferenceValue{FullPayloadPath: path, PayloadStoreClass: class}.AppendTo(nil)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	seeds = append(seeds,
		nil,
		[]byte{},
		[]byte{0},
		[]byte{0, 0},
		[]byte{0, 0, 0},
		[]byte{0, 0, 0, 0},
		[]byte{0, 0, 0, 0, 0, 0},
		[]byte{0, 0, 0, 1, 'x', 0, 0},
		[]byte{0, 0, 0, 1, 'x', 0xff, 0xff},
		[]byte{0, 0, 0xff, 0xff, 0, 0},
		[]byte{0, 0, 0x7f, 0xff},
		[]byte{0, 0, 0x80, 0x00},
		[]byte{0x7f, 0xff, 0, 1, 'x', 0, 0},
		[]byte{0x80, 0x00, 0, 1, 'x', 0, 0},
		enc("x", ""),
		enc("mem://a/t/b", "c"),
		enc("file:///ü/t/ü", "ferry.payloadstore.FileStore"),
		append(enc("x", ""), 0),
		[]byte{0, 0, 0, 2, 0xc3, 0x28, 0, 0},
		[]byte{0, 0, 0, 1, 0x00, 0, 0},
	)
	return seeds
}

// Seeds are kept small: the fuzzer minimizes every new interesting input,
// which for a 64 KiB seed takes its whole minimization budget and stalls the
// run. The 32767-byte STRING limit is covered by TestReferenceStringLimits.

// FuzzDecodeReference: DecodeReference never panics, every failure wraps
// ErrCorruptReference, and whatever it accepts re-encodes to exactly the
// same bytes (the encoding is canonical: one value, one byte string).
func FuzzDecodeReference(f *testing.F) {
	for _, s := range referenceSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		ref, err := largemessage.DecodeReference(b)
		if !bytes.Equal(b, in) {
			t.Fatalf("DecodeReference modified its input")
		}
		if err != nil {
			if !errors.Is(err, largemessage.ErrCorruptReference) {
				t.Fatalf("DecodeReference(%x): %v does not wrap ErrCorruptReference", b, err)
			}
			if ref != (largemessage.PayloadReferenceValue{}) {
				t.Fatalf("failed decode returned %+v", ref)
			}
			return
		}
		if ref.FullPayloadPath == "" {
			t.Fatalf("accepted an empty path: %x", b)
		}
		if !utf8.ValidString(ref.FullPayloadPath) || !utf8.ValidString(ref.PayloadStoreClass) {
			t.Fatalf("accepted invalid UTF-8: %x", b)
		}
		out, err := ref.AppendTo(nil)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", ref, err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("round trip changed the bytes:\n in  %x\n out %x", b, out)
		}
	})
}

// FuzzEncodeReference: AppendTo refuses exactly what a STRING cannot hold
// and an empty path (which DecodeReference refuses), and whatever it encodes
// decodes back to the same fields.
func FuzzEncodeReference(f *testing.F) {
	f.Add("file:///var/ferry/t/x", "ferry.payloadstore.FileStore")
	f.Add("mem://d/t/x", "")
	f.Add("", "c")
	f.Add("\xff", "c")
	f.Add("x", "\xc3\x28")
	f.Add("é", strings.Repeat("é", 3))
	f.Fuzz(func(t *testing.T, path, class string) {
		want := largemessage.PayloadReferenceValue{FullPayloadPath: path, PayloadStoreClass: class}
		b, err := want.AppendTo(nil)
		representable := path != "" && len(path) <= math.MaxInt16 && len(class) <= math.MaxInt16 && utf8.ValidString(path) && utf8.ValidString(class)
		if (err == nil) != representable {
			t.Fatalf("AppendTo(%d-byte path, %d-byte class): err %v, representable %v", len(path), len(class), err, representable)
		}
		if err != nil {
			return
		}
		if len(b) != 2+2+len(path)+2+len(class) {
			t.Fatalf("encoding is %d bytes, want %d", len(b), 6+len(path)+len(class))
		}
		got, err := largemessage.DecodeReference(b)
		if err != nil || got != want {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", want, got, err)
		}
	})
}

func TestReferenceStringLimits(t *testing.T) {
	longest := strings.Repeat("p", math.MaxInt16)
	for _, ref := range []largemessage.PayloadReferenceValue{
		{FullPayloadPath: longest},
		{FullPayloadPath: "x", PayloadStoreClass: longest},
		{FullPayloadPath: longest, PayloadStoreClass: longest},
	} {
		b, err := ref.AppendTo(nil)
		if err != nil {
			t.Fatalf("a %d-byte STRING is representable: %v", math.MaxInt16, err)
		}
		if len(ref.FullPayloadPath) == math.MaxInt16 && (b[2] != 0x7f || b[3] != 0xff) {
			t.Fatalf("length prefix %x, want 7fff", b[2:4])
		}
		got, err := largemessage.DecodeReference(b)
		if err != nil || got != ref {
			t.Fatalf("round trip of %d+%d bytes: %v", len(ref.FullPayloadPath), len(ref.PayloadStoreClass), err)
		}
	}
	tooLong := longest + "p"
	for _, ref := range []largemessage.PayloadReferenceValue{
		{FullPayloadPath: tooLong},
		{FullPayloadPath: "x", PayloadStoreClass: tooLong},
		{FullPayloadPath: "\xff"},
		{FullPayloadPath: "x", PayloadStoreClass: "\xc3\x28"},
	} {
		if b, err := ref.AppendTo(nil); err == nil {
			t.Errorf("AppendTo accepted a field a STRING cannot hold (%d bytes encoded)", len(b))
		}
	}
}
