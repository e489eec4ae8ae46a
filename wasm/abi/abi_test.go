package abi

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func sampleBatch() *Batch {
	return &Batch{Topic: "orders", Partition: 7, Records: []Record{
		{Offset: 0, Timestamp: 1700000000000, Key: []byte("k"), Value: []byte("hello"),
			Headers: []Header{{Key: "h1", Value: []byte("v1")}, {Key: "null", Value: nil}, {Key: "empty", Value: []byte{}}}},
		{Offset: 1, Timestamp: -1, Key: nil, Value: nil},
		{Offset: 1 << 40, Timestamp: 5, Key: []byte{}, Value: bytes.Repeat([]byte{0xff}, 1000)},
	}}
}

func TestBatchRoundTrip(t *testing.T) {
	b := sampleBatch()
	enc := EncodeBatch(nil, b)
	size := BatchHeaderSize(b.Topic)
	for _, r := range b.Records {
		size += RecordSize(r.Key, r.Value)
		for _, h := range r.Headers {
			size += HeaderSize(h.Key, h.Value)
		}
	}
	if len(enc) != size {
		t.Fatalf("encoded %d bytes, the size functions say %d", len(enc), size)
	}
	got, err := DecodeBatch(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, b) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, b)
	}
	// Null and empty stay distinct.
	if got.Records[1].Key != nil || got.Records[2].Key == nil || got.Records[0].Headers[1].Value != nil || got.Records[0].Headers[2].Value == nil {
		t.Fatal("null and empty were confused")
	}
	for cut := 0; cut < len(enc); cut++ {
		if _, err := DecodeBatch(enc[:cut]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("batch cut to %d bytes: err %v, want ErrMalformed", cut, err)
		}
	}
	if _, err := DecodeBatch(append(enc, 0)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing byte: err %v", err)
	}
}

func sampleResults() []Result {
	return []Result{
		{Action: Keep},
		{Action: Replace, Key: nil, Value: []byte("HELLO"), Headers: []Header{{Key: "x", Value: []byte("y")}, {Key: "n"}}},
		{Action: Skip},
		{Action: Reject, Reason: "value is not JSON"},
		{Action: Replace, Key: []byte{}, Value: nil},
	}
}

func TestOutputRoundTrip(t *testing.T) {
	res := sampleResults()
	enc := EncodeOutput(nil, res)
	got, err := DecodeOutput(enc, len(res))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, res) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, res)
	}
	if _, err := DecodeOutput(enc, len(res)+1); !errors.Is(err, ErrMalformed) {
		t.Fatalf("count mismatch: err %v", err)
	}
	for cut := 0; cut < len(enc); cut++ {
		if _, err := DecodeOutput(enc[:cut], len(res)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("output cut to %d bytes: err %v, want ErrMalformed", cut, err)
		}
	}
	if _, err := DecodeOutput(append(enc, 0), len(res)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing byte: err %v", err)
	}
}

func TestDecodeOutputRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		out []byte
		n   int
	}{
		"unknown action":     {[]byte{1, 0, 0, 0, 9}, 1},
		"huge count":         {[]byte{0xff, 0xff, 0xff, 0xff}, 1<<32 - 1},
		"huge value length":  {[]byte{1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xfe, 0xff, 0xff, 0x7f}, 1},
		"negative length":    {[]byte{1, 0, 0, 0, 1, 0xfe, 0xff, 0xff, 0xff}, 1},
		"huge header count":  {append([]byte{1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0xff, 0xff, 0xff, 0x0f), 1},
		"huge reason length": {[]byte{1, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff}, 1},
		"empty":              {nil, 0},
	} {
		if _, err := DecodeOutput(c.out, c.n); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
	if got, err := DecodeOutput([]byte{0, 0, 0, 0}, 0); err != nil || len(got) != 0 {
		t.Fatalf("zero results for zero records: %v %v", got, err)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	cfg := map[string]string{"b": "2", "a": "", "redact.fields": "ssn,card"}
	enc := EncodeConfig(cfg)
	// Sorted by key: "a" first.
	if !bytes.Equal(enc[:9], []byte{3, 0, 0, 0, 1, 0, 0, 0, 'a'}) {
		t.Fatalf("not sorted: % x", enc[:9])
	}
	got, err := DecodeConfig(enc)
	if err != nil || !reflect.DeepEqual(got, cfg) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	if got, err := DecodeConfig(EncodeConfig(nil)); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v %v", got, err)
	}
	if _, err := DecodeConfig(enc[:len(enc)-1]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short config: %v", err)
	}
}

func TestPack(t *testing.T) {
	p, n := UnpackResult(PackResult(0xfffffff0, 0x12345678))
	if p != 0xfffffff0 || n != 0x12345678 {
		t.Fatal(p, n)
	}
}

// FuzzDecodeOutput: arbitrary module output never panics, never decodes
// to another record count than asked, and what decodes re-encodes to the
// same bytes (the encoding is canonical).
func FuzzDecodeOutput(f *testing.F) {
	f.Add(EncodeOutput(nil, sampleResults()), uint16(5))
	f.Add([]byte{1, 0, 0, 0, 0}, uint16(1))
	f.Add([]byte{1, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0x7f}, uint16(1))
	f.Add([]byte{}, uint16(0))
	f.Fuzz(func(t *testing.T, out []byte, n uint16) {
		res, err := DecodeOutput(out, int(n))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(res) != int(n) {
			t.Fatalf("%d results for %d", len(res), n)
		}
		if again := EncodeOutput(nil, res); !bytes.Equal(again, out) {
			t.Fatalf("not canonical:\n in % x\nout % x", out, again)
		}
	})
}
