package largemessage_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// formatDoc is the wire format specification whose vectors these tests check.
const formatDoc = "../docs/FORMAT.md"

// The doc's current vector counts. Fewer found means vectors were removed
// or the parser no longer understands the doc: both must fail.
const (
	minValidVectors   = 5
	minInvalidVectors = 15
)

type validVector struct {
	name   string // the heading above the block, for messages
	ref    largemessage.PayloadReferenceValue
	length int
	enc    []byte
}

type invalidVector struct {
	name, reason string
	enc          []byte
}

type docHeader struct{ name, value string }

type formatVectors struct {
	valid   []validVector
	invalid []invalidVector
	// example is the header table of the complete example record.
	example []docHeader
	text    string
}

var (
	invalidRow = regexp.MustCompile("^\\|\\s*(I\\d+)\\s*\\|\\s*`([0-9a-fA-F ]*)`\\s*\\|\\s*(.*?)\\s*\\|\\s*$")
	exampleRow = regexp.MustCompile("^\\|\\s*(\\d+)\\s*\\|\\s*`([^`]+)`\\s*\\|\\s*`([^`]*)`\\s*\\|\\s*$")
	hexSpace   = strings.NewReplacer(" ", "", "\t", "")
)

// parseFormatDoc reads the vectors out of docs/FORMAT.md:
//
//   - valid vectors: fenced blocks tagged ferry-vector, with lines
//     `fullPayloadPath = "…"`, `payloadStoreClass = "…"`, `length = N`, then
//     `hex =` followed by hex lines (whitespace and # comments ignored);
//   - invalid vectors: table rows `| I<n> | `hex` | reason |`;
//   - the example record: table rows `| <n> | `name` | `value` |` after the
//     "A complete example" heading.
func parseFormatDoc(t testing.TB) formatVectors {
	t.Helper()
	raw, err := os.ReadFile(formatDoc)
	if err != nil {
		t.Fatalf("reading the format doc: %v", err)
	}
	var (
		fv      = formatVectors{text: string(raw)}
		heading string
		inBlock bool
		inHex   bool
		cur     validVector
		fields  map[string]bool
		example bool
		lineNo  int
	)
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if inBlock {
			if strings.TrimSpace(line) == "```" {
				if !fields["fullPayloadPath"] || !fields["payloadStoreClass"] || !fields["length"] || !fields["hex"] {
					t.Fatalf("%s:%d: vector %q lacks a field (has %v)", formatDoc, lineNo, cur.name, fields)
				}
				fv.valid = append(fv.valid, cur)
				inBlock = false
				continue
			}
			if inHex {
				h, _, _ := strings.Cut(line, "#")
				b, err := hex.DecodeString(hexSpace.Replace(strings.TrimSpace(h)))
				if err != nil {
					t.Fatalf("%s:%d: bad hex %q: %v", formatDoc, lineNo, line, err)
				}
				cur.enc = append(cur.enc, b...)
				continue
			}
			key, val, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s:%d: unexpected line in a vector block: %q", formatDoc, lineNo, line)
			}
			key, val = strings.TrimSpace(key), strings.TrimSpace(val)
			fields[key] = true
			switch key {
			case "fullPayloadPath", "payloadStoreClass":
				s, err := strconv.Unquote(val)
				if err != nil {
					t.Fatalf("%s:%d: %s is not a quoted string: %q", formatDoc, lineNo, key, val)
				}
				if key == "fullPayloadPath" {
					cur.ref.FullPayloadPath = s
				} else {
					cur.ref.PayloadStoreClass = s
				}
			case "length":
				if cur.length, err = strconv.Atoi(val); err != nil {
					t.Fatalf("%s:%d: length %q", formatDoc, lineNo, val)
				}
			case "hex":
				inHex = true
			default:
				t.Fatalf("%s:%d: unknown key %q in a vector block", formatDoc, lineNo, key)
			}
			continue
		}
		switch {
		case strings.HasPrefix(line, "#"):
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
			example = strings.Contains(heading, "A complete example")
		case strings.TrimSpace(line) == "```ferry-vector":
			inBlock, inHex = true, false
			cur = validVector{name: heading, enc: []byte{}}
			fields = map[string]bool{}
		default:
			if m := invalidRow.FindStringSubmatch(line); m != nil {
				b, err := hex.DecodeString(hexSpace.Replace(m[2]))
				if err != nil {
					t.Fatalf("%s:%d: bad hex in %s: %v", formatDoc, lineNo, m[1], err)
				}
				fv.invalid = append(fv.invalid, invalidVector{name: m[1], reason: m[3], enc: b})
			} else if m := exampleRow.FindStringSubmatch(line); m != nil && example {
				fv.example = append(fv.example, docHeader{m[2], m[3]})
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if inBlock {
		t.Fatalf("%s: unterminated ferry-vector block %q", formatDoc, cur.name)
	}
	return fv
}

func TestFormatDocValidVectors(t *testing.T) {
	fv := parseFormatDoc(t)
	if len(fv.valid) < minValidVectors {
		t.Fatalf("found %d valid vectors in %s, want at least %d", len(fv.valid), formatDoc, minValidVectors)
	}
	var nonASCII, emptyClass bool
	seen := map[string]bool{}
	for _, v := range fv.valid {
		t.Run(v.name, func(t *testing.T) {
			if seen[string(v.enc)] {
				t.Fatalf("duplicate vector")
			}
			seen[string(v.enc)] = true
			if len(v.enc) != v.length {
				t.Fatalf("the doc says length %d, its hex has %d bytes", v.length, len(v.enc))
			}
			got, err := v.ref.AppendTo(nil)
			if err != nil {
				t.Fatalf("AppendTo: %v", err)
			}
			if !bytes.Equal(got, v.enc) {
				t.Fatalf("encoding differs from the doc:\n got  %x\n want %x", got, v.enc)
			}
			// AppendTo appends.
			prefix := []byte{0xde, 0xad}
			got, err = v.ref.AppendTo(prefix)
			if err != nil || !bytes.Equal(got[:2], []byte{0xde, 0xad}) || !bytes.Equal(got[2:], v.enc) {
				t.Fatalf("AppendTo(prefix) = %x, %v", got, err)
			}
			dec, err := largemessage.DecodeReference(v.enc)
			if err != nil {
				t.Fatalf("DecodeReference: %v", err)
			}
			if dec != v.ref {
				t.Fatalf("decoded %+v, the doc says %+v", dec, v.ref)
			}
			// Every proper prefix is truncated, and so invalid.
			for i := range len(v.enc) {
				if _, err := largemessage.DecodeReference(v.enc[:i]); !errors.Is(err, largemessage.ErrCorruptReference) {
					t.Fatalf("the first %d bytes decoded: %v", i, err)
				}
			}
			// Any byte appended is trailing, and so invalid.
			for _, b := range []byte{0x00, 0x01, 0xff} {
				if _, err := largemessage.DecodeReference(append(bytes.Clone(v.enc), b)); !errors.Is(err, largemessage.ErrCorruptReference) {
					t.Fatalf("with a trailing %#x: %v", b, err)
				}
			}
			// The decoded fields do not alias the input.
			buf := bytes.Clone(v.enc)
			dec, _ = largemessage.DecodeReference(buf)
			for i := 4; i < len(buf); i++ {
				buf[i] ^= 0xff
			}
			if dec != v.ref {
				t.Fatal("decoded strings change when the input buffer is overwritten")
			}
		})
		for _, r := range v.ref.FullPayloadPath {
			nonASCII = nonASCII || r > 0x7f
		}
		emptyClass = emptyClass || v.ref.PayloadStoreClass == ""
	}
	if !nonASCII {
		t.Error("no valid vector has a non-ASCII path")
	}
	if !emptyClass {
		t.Error("no valid vector has an empty payloadStoreClass")
	}
}

func TestFormatDocInvalidVectors(t *testing.T) {
	fv := parseFormatDoc(t)
	if len(fv.invalid) < minInvalidVectors {
		t.Fatalf("found %d invalid vectors in %s, want at least %d", len(fv.invalid), formatDoc, minInvalidVectors)
	}
	kinds := map[string]bool{}
	for _, v := range fv.invalid {
		t.Run(v.name, func(t *testing.T) {
			ref, err := largemessage.DecodeReference(v.enc)
			if !errors.Is(err, largemessage.ErrCorruptReference) {
				t.Fatalf("%x (%s): decoded %+v, %v; want ErrCorruptReference", v.enc, v.reason, ref, err)
			}
			if ref != (largemessage.PayloadReferenceValue{}) {
				t.Fatalf("a failed decode returned %+v", ref)
			}
		})
		for _, k := range []string{"truncated", "version 1", "trailing", "null", "UTF-8"} {
			if strings.Contains(v.reason, k) {
				kinds[k] = true
			}
		}
	}
	for _, k := range []string{"truncated", "version 1", "trailing", "null", "UTF-8"} {
		if !kinds[k] {
			t.Errorf("no invalid vector is about %q", k)
		}
	}
}

// TestFormatDocNamesHeaders keeps the doc's header names in step with the code.
func TestFormatDocNamesHeaders(t *testing.T) {
	fv := parseFormatDoc(t)
	for _, name := range []string{
		largemessage.HeaderLargeMessage, largemessage.HeaderLargeMessageKey,
		largemessage.HeaderPayloadSize, largemessage.HeaderPayloadSHA256, largemessage.HeaderPayloadMetadata, largemessage.HeaderPayloadCRC32C,
		largemessage.HeaderKeyPayloadSize, largemessage.HeaderKeyPayloadSHA256, largemessage.HeaderKeyPayloadMetadata,
		payloadstore.FileStoreClass, payloadstore.MemStoreClass,
	} {
		if !strings.Contains(fv.text, "`"+name+"`") {
			t.Errorf("%s does not mention `%s`", formatDoc, name)
		}
	}
}

// fixedID names every object with one id, so the example's path is known.
type fixedID string

func (f fixedID) ID(payloadstore.Payload) string { return string(f) }

// TestFormatDocExampleRecord produces the doc's example record with the real
// serializer and compares it with the doc: same headers in the same order,
// same values, and a value that is the reference of vector V1 but for the
// store root.
func TestFormatDocExampleRecord(t *testing.T) {
	fv := parseFormatDoc(t)
	if len(fv.example) < 5 {
		t.Fatalf("found %d example header rows in %s, want 5", len(fv.example), formatDoc)
	}
	v1 := fv.valid[0]
	const id = "3f2c6d1e-8a4b-4c5d-9e7f-0a1b2c3d4e5f"
	if !strings.HasSuffix(v1.ref.FullPayloadPath, "/orders/0f/"+id) || len(v1.enc) != 102 {
		t.Fatalf("V1 is not the example's reference: %+v (%d bytes)", v1.ref, len(v1.enc))
	}

	dir := t.TempDir()
	fs, err := payloadstore.NewFileStore(dir, fixedID(id))
	if err != nil {
		t.Fatal(err)
	}
	store := payloadstore.Wrap(fs, payloadstore.DefaultPolicy)
	payload := make([]byte, 5<<20)
	rec := &kgo.Record{
		Topic:   "orders",
		Key:     []byte("order-42"),
		Value:   payload,
		Headers: []kgo.RecordHeader{{Key: fv.example[0].name, Value: []byte(fv.example[0].value)}},
	}
	ser := largemessage.NewSerializer(store, largemessage.Codec{Type: "none"})
	if _, err := ser.Offload(context.Background(), rec, largemessage.DeriveLimits(0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if len(rec.Headers) != len(fv.example) {
		t.Fatalf("the serializer wrote %d headers, the doc lists %d", len(rec.Headers), len(fv.example))
	}
	for i, h := range rec.Headers {
		if h.Key != fv.example[i].name || string(h.Value) != fv.example[i].value {
			t.Errorf("header %d: serializer %s=%q, doc %s=%q", i+1, h.Key, h.Value, fv.example[i].name, fv.example[i].value)
		}
	}
	if sum := sha256.Sum256(payload); fv.example[3].value != hex.EncodeToString(sum[:]) {
		t.Errorf("the doc's digest is not the SHA-256 of 5 MiB of zeros")
	}
	if crc := crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)); fv.example[4].value != fmt.Sprintf("%08x", crc) {
		t.Errorf("the doc's CRC-32C is not that of 5 MiB of zeros (%08x)", crc)
	}
	if string(rec.Key) != "order-42" {
		t.Errorf("key changed: %q", rec.Key)
	}
	ref, err := largemessage.DecodeReference(rec.Value)
	if err != nil {
		t.Fatal(err)
	}
	want := largemessage.PayloadReferenceValue{
		FullPayloadPath:   string(fs.Root()) + "/orders/0f/" + id, // 0f: SHA-256(id)'s first byte
		PayloadStoreClass: v1.ref.PayloadStoreClass,
	}
	if ref != want {
		t.Fatalf("reference %+v, want %+v (V1 with this store's root)", ref, want)
	}
}
