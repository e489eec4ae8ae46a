package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/internal/jsonvalue"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzRewriteBatch feeds arbitrary record sets to both sides of a chain
// that changes and skips records (and leaves those whose value starts with
// "keep" as they are): no input may panic, and whatever the chain forwards
// must be valid batches (CRC, lengths, record counts). A chain whose
// interceptor changes nothing (read in place) must forward a produce
// request's records, and a fetch response's, as the very bytes it got.
func FuzzRewriteBatch(f *testing.F) {
	for attrs := int16(0); attrs <= 4; attrs++ {
		f.Add(plainBatch(&testing.T{}, attrs, -1, "a", "skip", `{"k":"v"}`), false, uint8(0))
		f.Add(plainBatch(&testing.T{}, attrs, 7, "idempotent"), false, uint8(0))
		// In place: unchanged records around changed and skipped ones,
		// and a batch of unchanged records only.
		f.Add(plainBatch(&testing.T{}, attrs, -1, "keep1", "a", "keep2", "skip", "keep3"), false, uint8(0))
		f.Add(append(plainBatch(&testing.T{}, attrs, -1, "keep1", "keep2"), plainBatch(&testing.T{}, attrs, 7, "keep3")...), false, uint8(0))
		// The records section alone, wrapped with a valid header below.
		f.Add(plainBatch(&testing.T{}, 0, -1, "a", "skip")[61:], true, uint8(2))
	}
	f.Add([]byte{}, false, uint8(0))
	f.Add(make([]byte, 61), false, uint8(0))
	fn := func(_ context.Context, r *Record) error {
		if bytes.Equal(r.Value, []byte("skip")) {
			return ErrSkipRecord
		}
		if bytes.HasPrefix(r.Value, []byte("keep")) {
			return nil
		}
		r.Value = append(bytes.Clone(r.Value), '!')
		r.Headers = append(r.Headers, Header{Key: "h", Value: r.Key})
		return nil
	}
	ch := NewChain([]Instance{{Produce: &funcIcpt{name: "p", re: mustPattern("t"), fn: fn},
		Fetch: &funcIcpt{name: "f", re: mustPattern("t"), fn: fn}}}, Options{})
	// look reads every field and changes nothing (validate-json's shape).
	look := func(_ context.Context, r *Record) error {
		n := len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			n += len(h.Key) + len(h.Value)
		}
		if n < 0 {
			return errTest
		}
		return nil
	}
	same := NewChain([]Instance{{Produce: &funcIcpt{name: "p", re: mustPattern("t"), fn: look},
		Fetch: &funcIcpt{name: "f", re: mustPattern("t"), fn: look}}}, Options{})
	// The same changes by inliners: run on the caller's goroutine, produce
	// batches encoded into pooled buffers (poisoned once given back).
	inl := NewChain([]Instance{{Produce: inlineIcpt{&funcIcpt{name: "p", re: mustPattern("t"), fn: fn}},
		Fetch: inlineIcpt{&funcIcpt{name: "f", re: mustPattern("t"), fn: fn}}}}, Options{})
	// valid fails t unless set is whole batches, each of which decodes
	// when it is magic v2, or, on fetch, is one of in's as it came (a
	// control batch passes as the broker sent it, CRC unchecked).
	valid := func(t *testing.T, set, in []byte) {
		for rest := set; len(rest) > 0; {
			raw, next, ok := splitBatch(rest)
			if !ok {
				t.Fatalf("forwarded a truncated batch")
			}
			if in != nil && bytes.Contains(in, raw) {
				rest = next
				continue
			}
			if _, err := decodeBatch(context.Background(), nil, raw); err != nil && raw[magicOffset] == 2 {
				t.Fatalf("forwarded an invalid batch: %v", err)
			}
			rest = next
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, wrap bool, n uint8) {
		if wrap {
			// A batch with a valid CRC around fuzzed records, so the
			// record decoder is reached.
			d := &decodedBatch{hdr: plainHeader(int32(n), int16(n>>4)&7)}
			h := d.hdr
			h.Records = b
			h.Length = int32(49 + len(b))
			b = h.AppendTo(nil)
			binary.BigEndian.PutUint32(b[crcOffset:], crc32.Checksum(b[attrOffset:], castagnoli))
		}
		req := buildRequest(t, map[string][]byte{"t": bytes.Clone(b)})
		out := ch.InterceptProduce(context.Background(), req, allTopics(1<<20))
		if out.Forward {
			valid(t, req.Topics[0].Partitions[0].Records, nil)
		}
		resp := fetchResponse(map[string][]byte{"t": bytes.Clone(b)})
		ch.InterceptFetch(context.Background(), resp)

		// Inliners forward what the chain does, byte for byte, and
		// their fetch output is whole, valid batches too.
		want := req
		req = buildRequest(t, map[string][]byte{"t": bytes.Clone(b)})
		iout := inl.InterceptProduce(context.Background(), req, allTopics(1<<20))
		if iout.Forward != out.Forward || out.Forward && !bytes.Equal(req.Topics[0].Partitions[0].Records, want.Topics[0].Partitions[0].Records) {
			t.Fatalf("inliners forwarded %v, other bytes than the chain's (%v)", iout.Forward, out.Forward)
		}
		iout.Release()
		out.Release()
		resp = fetchResponse(map[string][]byte{"t": bytes.Clone(b)})
		fo := inl.InterceptFetch(context.Background(), resp)
		valid(t, resp.Topics[0].Partitions[0].RecordBatches, b)
		fo.Release()

		req = buildRequest(t, map[string][]byte{"t": bytes.Clone(b)})
		out = same.InterceptProduce(context.Background(), req, allTopics(1<<20))
		if out.Forward && !bytes.Equal(req.Topics[0].Partitions[0].Records, b) {
			t.Fatalf("a chain that changes nothing forwarded other bytes (rewritten %d)", out.Rewritten)
		}
		out.Release()
		resp = fetchResponse(map[string][]byte{"t": bytes.Clone(b)})
		fo = same.InterceptFetch(context.Background(), resp)
		// A partial batch at the end is dropped; anything else comes
		// back as it came, or the partition fails.
		if got := resp.Topics[0].Partitions[0].RecordBatches; len(fo.Failed) == 0 && fo.Truncated == 0 && !bytes.Equal(got, b) {
			t.Fatalf("a chain that changes nothing returned other bytes (rewritten %d)", fo.Rewritten)
		}
		fo.Release()
	})
}

func mustPattern(p string) *regexp.Regexp {
	re, err := CompileTopicPattern(p)
	if err != nil {
		panic(err)
	}
	return re
}

func plainHeader(n int32, attrs int16) kmsg.RecordBatch {
	return kmsg.RecordBatch{Magic: 2, Attributes: attrs, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: n, LastOffsetDelta: n - 1, PartitionLeaderEpoch: -1}
}

// fuzzJSONSeeds are FuzzJSON's seeds, redacted with fuzzJSONFields.
var fuzzJSONSeeds = []string{`{"a":1}`, `{"n":1e400,"email":"a","email":"secret"}`, `[[[[[]]]]]`,
	`{"a":{"b":[1,2,{"c":"\u00e9"}]}}`, `"\ud800"`, `{"a":1,"a":2}`, `{"\u0061":1,"a":2}`, strings.Repeat("[", 2000),
	`{"EMAIL":"x","B":[{"C":1},{"c":{"x":1}},2]}`, `{"email":"x","Email":"y"}`, `{"\u212aind":1,"Kind":2}`,
	`{"d":[0,{"e":1,"E":2},{"e":3}],"d.1":{"e":4}}`, `{"f":[[1],{"g":2},[3,[4]]],"g.h":1,"g":{"h":2}}`,
	`{"i":{"j":{"k":1}},"I":0}`, ` [ {"a" : [ 1 ] } ] `, `{"b":{"0":{"c":1}},"d":{"1":{"e":1}}}`}

const fuzzJSONFields = `a,email,b.#.c,d.1.e,f.#.#,g\.h,i.j,i,kind`

// FuzzJSON feeds arbitrary values to the JSON check and to both JSON
// interceptors: no input may panic or recurse without bound, and what the
// check accepts is valid JSON without a duplicate name (encoding/json
// agrees on validity). redact, with names compared case-insensitively
// (the default) and exactly, refuses what the check refuses, and exactly
// as much more as two names equal but for case in one object; on what it
// accepts its output is valid JSON, every configured field in it (found
// by a walk of the decoded value, names compared as redact compares them)
// is the mask, everything else decodes as the input did, and the bytes
// outside the masked spans are the input's.
func FuzzJSON(f *testing.F) {
	for _, s := range fuzzJSONSeeds {
		f.Add([]byte(s))
	}
	const fields = fuzzJSONFields
	paths := [][]string{{"a"}, {"email"}, {"b", "#", "c"}, {"d", "1", "e"}, {"f", "#", "#"}, {"g.h"}, {"i", "j"}, {"i"}, {"kind"}}
	red, err := New(context.Background(), "redact", map[string]string{KeyRedactFields: fields, KeyJSONMaxDepth: "64"})
	if err != nil {
		f.Fatal(err)
	}
	exact, err := New(context.Background(), "redact", map[string]string{KeyRedactFields: fields, KeyJSONMaxDepth: "64", KeyRedactCaseSensitive: "true"})
	if err != nil {
		f.Fatal(err)
	}
	var rds [2]*jsonvalue.Redactor // [0] case-insensitive, [1] exact
	for i, fold := range []bool{true, false} {
		rd, err := jsonvalue.NewRedactor(map[string]string{KeyRedactFields: fields, KeyJSONMaxDepth: "64",
			KeyRedactCaseSensitive: strconv.FormatBool(!fold)})
		if err != nil {
			f.Fatal(err)
		}
		rds[i] = rd
	}
	val, err := New(context.Background(), "validate-json", map[string]string{KeyJSONMaxDepth: "64",
		KeyJSONSchema: `{"type":"object","properties":{"a":{"type":"integer"}}}`})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := jsonvalue.Check(b, 64)
		if err == nil && !json.Valid(b) {
			t.Fatalf("checkJSON accepted %q, which encoding/json rejects", b)
		}
		for i, in := range []Instance{red, exact} {
			fold := i == 0
			r := &Record{Topic: "t", Value: bytes.Clone(b)}
			rerr := in.Produce.ProcessRecord(context.Background(), r)
			switch {
			case rerr == nil && err != nil:
				t.Fatalf("redact (fold %v) accepted %q, which checkJSON refuses: %v", fold, b, err)
			case rerr != nil && err == nil && (!fold || !hasFoldedDuplicate(t, b)):
				t.Fatalf("redact (fold %v) refused %q, which checkJSON accepts: %v", fold, b, rerr)
			case rerr != nil:
				continue
			}
			if !json.Valid(r.Value) {
				t.Fatalf("redact turned %q into invalid JSON %q", b, r.Value)
			}
			spans, serr := rds[i].Spans(context.Background(), b)
			if serr != nil {
				t.Fatalf("spans of %q: %v", b, serr)
			}
			// The output is the input with each span, a whole JSON
			// value, replaced by the mask.
			prev, out := 0, r.Value
			for _, sp := range spans {
				if sp.Start < prev || sp.End <= sp.Start || sp.End > len(b) || !json.Valid(b[sp.Start:sp.End]) ||
					len(bytes.TrimSpace(b[sp.Start:sp.End])) != sp.End-sp.Start {
					t.Fatalf("%q: bad span %v in %v", b, sp, spans)
				}
				n := sp.Start - prev
				if !bytes.HasPrefix(out, b[prev:sp.Start]) || !bytes.HasPrefix(out[n:], []byte(`"***"`)) {
					t.Fatalf("%q became %q: bytes before the span %v changed", b, r.Value, sp)
				}
				out, prev = out[n+len(`"***"`):], sp.End
			}
			if !bytes.Equal(out, b[prev:]) {
				t.Fatalf("%q became %q: bytes after the last span changed", b, r.Value)
			}
			checkRedacted(t, decodeAny(t, b), decodeAny(t, r.Value), paths, fold, "$")
		}
		_ = val.Produce.ProcessRecord(context.Background(), &Record{Topic: "t", Value: bytes.Clone(b)})
	})
}

func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
	return v
}

// checkRedacted compares a decoded value in with its redacted form out:
// where one of paths ends (a configured field), out must be the mask;
// elsewhere out must be in. Names are compared with strings.EqualFold when
// fold; "#" is every element of an array, digits one element or a name.
func checkRedacted(t *testing.T, in, out any, paths [][]string, fold bool, where string) {
	t.Helper()
	for _, p := range paths {
		if len(p) == 0 {
			if out != "***" {
				t.Fatalf("%s survived redaction: %v", where, out)
			}
			return
		}
	}
	switch v := in.(type) {
	case map[string]any:
		o, ok := out.(map[string]any)
		if !ok || len(o) != len(v) {
			t.Fatalf("%s: %v became %v", where, in, out)
		}
		for k, x := range v {
			var sub [][]string
			for _, p := range paths {
				if p[0] != "#" && (p[0] == k || fold && strings.EqualFold(p[0], k)) {
					sub = append(sub, p[1:])
				}
			}
			y, ok := o[k]
			if !ok {
				t.Fatalf("%s: member %q lost", where, k)
			}
			checkRedacted(t, x, y, sub, fold, where+"."+k)
		}
	case []any:
		o, ok := out.([]any)
		if !ok || len(o) != len(v) {
			t.Fatalf("%s: %v became %v", where, in, out)
		}
		for i, x := range v {
			var sub [][]string
			for _, p := range paths {
				if p[0] == "#" || p[0] == strconv.Itoa(i) {
					sub = append(sub, p[1:])
				}
			}
			checkRedacted(t, x, o[i], sub, fold, fmt.Sprintf("%s[%d]", where, i))
		}
	default:
		if in != out {
			t.Fatalf("%s: %v became %v", where, in, out)
		}
	}
}

// hasFoldedDuplicate reports whether the valid JSON b has an object with
// two member names equal to strings.EqualFold.
func hasFoldedDuplicate(t *testing.T, b []byte) bool {
	t.Helper()
	type frame struct {
		obj     bool
		wantKey bool
		keys    []string
	}
	var stack []frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Fatalf("tokens of %q: %v", b, err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, frame{obj: tok == json.Delim('{'), wantKey: true})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			k := tok.(string)
			for _, o := range stack[n-1].keys {
				if strings.EqualFold(o, k) {
					return true
				}
			}
			stack[n-1].keys = append(stack[n-1].keys, k)
			stack[n-1].wantKey = false
			continue
		}
		valueDone()
	}
}
