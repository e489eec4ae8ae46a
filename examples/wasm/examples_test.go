// Tests of the example WebAssembly interceptors, built from source
// (internal/wasmtest) and run in-process by the wasm interceptor's host.
package wasm_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/interceptor/wasm"
	"github.com/ferrykit/ferry/internal/wasmtest"
)

// load loads the module at path with the wasm interceptor.
func load(t *testing.T, path string, config map[string]string) interceptor.Instance {
	t.Helper()
	cfg := map[string]string{wasm.KeyModulePath: path}
	for k, v := range config {
		cfg[k] = v
	}
	in, err := wasm.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	return in
}

// process runs one batch of rs through the produce side of in.
func process(t *testing.T, in interceptor.Instance, rs ...*interceptor.Record) []error {
	t.Helper()
	b, ok := in.Produce.(interceptor.BatchInterceptor)
	if !ok {
		t.Fatalf("no produce side: %+v", in)
	}
	errs, err := b.ProcessBatch(context.Background(), rs)
	if err != nil {
		t.Fatal(err)
	}
	return errs
}

func rec(i int, value string) *interceptor.Record {
	return &interceptor.Record{Topic: "t", Partition: 1, Offset: int64(i), Key: []byte("k"), Value: []byte(value),
		Headers: []interceptor.Header{{Key: "h", Value: []byte("v")}}}
}

func TestUppercase(t *testing.T) {
	in := load(t, wasmtest.Go(t, "examples/wasm/uppercase"), nil)
	if in.Fetch != nil {
		t.Fatal("uppercase has no fetch function, but its ferry_sides did not keep it from fetch")
	}
	rs := []*interceptor.Record{rec(0, "hello"), rec(1, "Grüße"), rec(2, ""), rec(3, "SAME")}
	rs[2].Value = nil
	same := rs[3].Value
	if errs := process(t, in, rs...); errs != nil {
		t.Fatal(errs)
	}
	if string(rs[0].Value) != "HELLO" || string(rs[1].Value) != "GRÜSSE" && string(rs[1].Value) != "GRÜßE" || rs[2].Value != nil {
		t.Fatalf("values %q %q %v", rs[0].Value, rs[1].Value, rs[2].Value)
	}
	if &rs[3].Value[0] != &same[0] || string(rs[0].Key) != "k" || len(rs[0].Headers) != 1 || string(rs[0].Headers[0].Value) != "v" {
		t.Fatalf("unchanged parts changed: %+v", rs)
	}
	// Nothing to change: the module answers with the empty output and
	// the records are the same objects with the same bytes.
	keep := []*interceptor.Record{rec(0, "A"), rec(1, "B 1")}
	v0 := keep[0].Value
	if errs := process(t, in, keep...); errs != nil || &keep[0].Value[0] != &v0[0] {
		t.Fatal("a batch already upper case was rewritten", errs)
	}
	// A batch of 8 MiB, in the default wasm.memory.max.bytes.
	big := rec(0, strings.Repeat("abc", 8<<20/3))
	if errs := process(t, in, big); errs != nil || !bytes.Equal(big.Value, bytes.Repeat([]byte("ABC"), 8<<20/3)) {
		t.Fatal("8 MiB value", errs)
	}
}

func TestTagger(t *testing.T) {
	path := wasmtest.Go(t, "examples/wasm/tagger")
	in := load(t, path, map[string]string{"wasm.config.tag.header": "route", "wasm.config.tag.value": "eu", "wasm.config.skip.header": "drop"})
	rs := []*interceptor.Record{rec(0, "a"), rec(1, "b"), rec(2, "c"), rec(3, "d")}
	rs[1].Headers = append(rs[1].Headers, interceptor.Header{Key: "route", Value: []byte("us")}, interceptor.Header{Key: "route", Value: []byte("x")})
	rs[2].Headers = append(rs[2].Headers, interceptor.Header{Key: "drop"})
	rs[3].Headers = []interceptor.Header{{Key: "route", Value: []byte("eu")}}
	errs := process(t, in, rs...)
	if errs == nil || !errors.Is(errs[2], interceptor.ErrSkipRecord) || errs[0] != nil || errs[1] != nil || errs[3] != nil {
		t.Fatalf("errs %v, want a skip for the record with header drop", errs)
	}
	want := func(r *interceptor.Record, hs ...string) {
		t.Helper()
		var got []string
		for _, h := range r.Headers {
			got = append(got, h.Key+"="+string(h.Value))
		}
		if strings.Join(got, ",") != strings.Join(hs, ",") {
			t.Errorf("record %d headers %v, want %v", r.Offset, got, hs)
		}
	}
	want(rs[0], "h=v", "route=eu")
	want(rs[1], "h=v", "route=eu")
	want(rs[3], "route=eu")
	// Without tag.header the module refuses its configuration.
	if _, err := wasm.New(context.Background(), map[string]string{wasm.KeyModulePath: path}); err == nil || !strings.Contains(err.Error(), "tag.header") {
		t.Fatalf("no tag.header: %v", err)
	}
}

// maxsize-as is written in AssemblyScript: its compiler comes from npm.
func TestMaxSizeAssemblyScript(t *testing.T) {
	path := wasmtest.AssemblyScript(t, "examples/wasm/maxsize-as")
	in := load(t, path, map[string]string{"wasm.config.max.bytes": "10"})
	if in.Fetch != nil {
		t.Fatal("maxsize-as has no fetch side")
	}
	// rec's key and header (name and value) are 3 bytes of the 10.
	rs := []*interceptor.Record{rec(0, "1234567"), rec(1, "12345678"), rec(2, "12"), rec(3, strings.Repeat("x", 1000))}
	errs := process(t, in, rs...)
	if errs == nil || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errs %v", errs)
	}
	for i, size := range map[int]string{1: "11", 3: "1003"} {
		if !errors.Is(errs[i], wasm.ErrRejected) || errs[i].Error() != "maxsize-as: record of "+size+" bytes (key, value and headers) is over max.bytes=10" {
			t.Errorf("record %d: %v", i, errs[i])
		}
	}
	if errs := process(t, in, rec(0, "123456"), rec(1, "")); errs != nil {
		t.Fatal(errs)
	}
	for _, bad := range []string{"", "0", "x", "99999999999999999"} {
		cfg := map[string]string{wasm.KeyModulePath: path}
		if bad != "" {
			cfg["wasm.config.max.bytes"] = bad
		}
		if _, err := wasm.New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "max.bytes") {
			t.Errorf("max.bytes=%q: %v", bad, err)
		}
	}
}
