package interceptor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/interceptor/wasm"
	"github.com/ferrykit/ferry/internal/wasmtest"
	"github.com/ferrykit/ferry/wasm/abi"
)

// The WebAssembly port of redact (examples/wasm/redact) answers as the
// built-in does on the whole redact test corpus: the same value byte for
// byte, or a refusal with the same message; a null value passes both. One
// config runs through the wasm interceptor (the host as the proxy runs
// it); every config runs in one compiled copy of the module driven through
// the ABI here (compiling a Go module takes seconds, the corpus has some
// 25 configs, and the host compiles once per load).
func TestRedactWasmEqualsBuiltin(t *testing.T) {
	path := wasmtest.Go(t, "examples/wasm/redact")
	ctx := context.Background()
	var configs []map[string]string
	byConfig := map[string][]interceptor.RedactCase{}
	for _, c := range interceptor.RedactCorpus(t) {
		k := configKey(c.Config)
		if byConfig[k] == nil {
			configs = append(configs, c.Config)
		}
		byConfig[k] = append(byConfig[k], c)
	}
	mod := newGuest(t, path)
	masked, refused, values := 0, 0, 0
	for i, cfg := range configs {
		cases := byConfig[configKey(cfg)]
		builtin, err := interceptor.New(ctx, "redact", cfg)
		if err != nil {
			t.Fatal(err)
		}
		var want, got []*interceptor.Record
		for j, c := range append(cases, interceptor.RedactCase{Config: cfg}) { // the last one null
			want = append(want, &interceptor.Record{Topic: "t", Offset: int64(j), Value: bytes.Clone(c.Value)})
			got = append(got, &interceptor.Record{Topic: "t", Offset: int64(j), Value: bytes.Clone(c.Value)})
		}
		got[len(got)-1].Value, want[len(want)-1].Value = nil, nil
		var errs []error
		if i == 0 {
			errs = viaHost(t, path, cfg, got)
		} else {
			errs = mod.produce(t, cfg, got)
		}
		for j, w := range want {
			values++
			berr := builtin.Produce.ProcessRecord(ctx, w)
			var werr error
			if errs != nil {
				werr = errs[j]
			}
			switch {
			case berr == nil && werr == nil:
				if !bytes.Equal(w.Value, got[j].Value) || (w.Value == nil) != (got[j].Value == nil) {
					t.Errorf("config %v, value %q: built-in %q, module %q", cfg, got[j].Value, w.Value, got[j].Value)
				}
				if strings.Contains(string(w.Value), `"***"`) {
					masked++
				}
			case berr != nil && werr != nil:
				if werr.Error() != berr.Error() {
					t.Errorf("config %v, value %q: built-in refused with %q, module with %q", cfg, w.Value, berr, werr)
				}
				refused++
			default:
				t.Errorf("config %v, value %q: built-in %v, module %v", cfg, w.Value, berr, werr)
			}
		}
		if builtin.Close != nil {
			builtin.Close()
		}
	}
	if masked < 20 || refused < 20 {
		t.Fatalf("the corpus masked %d values and refused %d: too few to compare", masked, refused)
	}
	t.Logf("%d values in %d configs: %d masked, %d refused, alike", values, len(configs), masked, refused)
}

// viaHost runs recs through the module loaded by the wasm interceptor.
func viaHost(t *testing.T, path string, cfg map[string]string, recs []*interceptor.Record) []error {
	t.Helper()
	wcfg := map[string]string{wasm.KeyModulePath: path}
	for k, v := range cfg {
		wcfg[wasm.KeyConfigPrefix+k] = v
	}
	in, err := wasm.New(context.Background(), wcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	errs, err := in.Produce.(interceptor.BatchInterceptor).ProcessBatch(context.Background(), recs)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		if e != nil && !errors.Is(e, wasm.ErrRejected) {
			t.Fatalf("the host's error %v does not wrap wasm.ErrRejected", e)
		}
	}
	return errs
}

// guest is a module compiled once, instantiated per config and called
// through ABI v1 (wasm/abi) without the host.
type guest struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
}

func newGuest(t *testing.T, path string) *guest {
	t.Helper()
	ctx := context.Background()
	code, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	compiled, err := rt.CompileModule(ctx, code)
	if err != nil {
		t.Fatal(err)
	}
	return &guest{rt: rt, compiled: compiled}
}

// call writes in into the instance (ferry_alloc) and calls fn on it,
// returning the bytes its result points at.
func call(t *testing.T, m api.Module, fn string, in []byte) []byte {
	t.Helper()
	ctx := context.Background()
	res, err := m.ExportedFunction(abi.AllocExport).Call(ctx, uint64(len(in)))
	if err != nil || res[0] == 0 {
		t.Fatalf("ferry_alloc(%d): %v %v", len(in), res, err)
	}
	if !m.Memory().Write(uint32(res[0]), in) {
		t.Fatal("ferry_alloc returned memory out of range")
	}
	out, err := m.ExportedFunction(fn).Call(ctx, res[0], uint64(len(in)))
	if err != nil {
		t.Fatalf("%s: %v", fn, err)
	}
	ptr, n := abi.UnpackResult(out[0])
	if n == 0 {
		return nil
	}
	b, ok := m.Memory().Read(ptr, n)
	if !ok {
		t.Fatalf("%s returned memory out of range", fn)
	}
	return bytes.Clone(b)
}

// produce starts an instance with cfg and runs recs through its
// ferry_on_produce, applying the output as the host does.
func (g *guest) produce(t *testing.T, cfg map[string]string, recs []*interceptor.Record) []error {
	t.Helper()
	ctx := context.Background()
	m, err := g.rt.InstantiateModule(ctx, g.compiled, wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	if msg := call(t, m, abi.InitExport, abi.EncodeConfig(cfg)); msg != nil {
		t.Fatalf("ferry_init refused %v: %s", cfg, msg)
	}
	b := &abi.Batch{Topic: recs[0].Topic, Partition: recs[0].Partition}
	for _, r := range recs {
		b.Records = append(b.Records, abi.Record{Offset: r.Offset, Timestamp: r.Timestamp, Key: r.Key, Value: r.Value})
	}
	out := call(t, m, abi.ProduceExport, abi.EncodeBatch(nil, b))
	if out == nil {
		return nil
	}
	res, err := abi.DecodeOutput(out, len(recs))
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	for i, r := range res {
		switch r.Action {
		case abi.Replace:
			recs[i].Key, recs[i].Value = r.Key, r.Value
		case abi.Reject:
			if errs == nil {
				errs = make([]error, len(recs))
			}
			errs[i] = errors.New(r.Reason)
		case abi.Skip:
			t.Fatalf("record %d skipped", i)
		}
	}
	return errs
}

func configKey(c map[string]string) string {
	var ks []string
	for k, v := range c {
		ks = append(ks, fmt.Sprintf("%q=%q", k, v))
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}
