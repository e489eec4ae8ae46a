package interceptor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/interceptor/wasm"
	"github.com/ferrykit/ferry/internal/wasmtest"
)

// The WebAssembly port of redact (examples/wasm/redact, run by the wasm
// interceptor) answers as the built-in does on the whole redact test
// corpus: the same value byte for byte, or a refusal with the same
// message; a null value passes both.
func TestRedactWasmEqualsBuiltin(t *testing.T) {
	path := wasmtest.Go(t, "examples/wasm/redact")
	ctx := context.Background()
	corpus := interceptor.RedactCorpus(t)
	byConfig := map[string][]interceptor.RedactCase{}
	for _, c := range corpus {
		k := configKey(c.Config)
		byConfig[k] = append(byConfig[k], c)
	}
	masked, refused := 0, 0
	for _, cases := range byConfig {
		cfg := cases[0].Config
		builtin, err := interceptor.New(ctx, "redact", cfg)
		if err != nil {
			t.Fatal(err)
		}
		wcfg := map[string]string{wasm.KeyModulePath: path}
		for k, v := range cfg {
			wcfg[wasm.KeyConfigPrefix+k] = v
		}
		mod, err := wasm.New(ctx, wcfg)
		if err != nil {
			t.Fatal(err)
		}
		// The corpus of one config as one batch, plus a null value.
		var want, got []*interceptor.Record
		for i, c := range append(cases, interceptor.RedactCase{Config: cfg}) {
			want = append(want, &interceptor.Record{Topic: "t", Offset: int64(i), Value: bytes.Clone(c.Value)})
			got = append(got, &interceptor.Record{Topic: "t", Offset: int64(i), Value: bytes.Clone(c.Value)})
		}
		got[len(got)-1].Value, want[len(want)-1].Value = nil, nil
		errs, err := mod.Produce.(interceptor.BatchInterceptor).ProcessBatch(ctx, got)
		if err != nil {
			t.Fatalf("config %v: %v", cfg, err)
		}
		for i, w := range want {
			berr := builtin.Produce.ProcessRecord(ctx, w)
			var werr error
			if errs != nil {
				werr = errs[i]
			}
			switch {
			case berr == nil && werr == nil:
				if !bytes.Equal(w.Value, got[i].Value) || (w.Value == nil) != (got[i].Value == nil) {
					t.Errorf("config %v, value %q: built-in %q, module %q", cfg, got[i].Value, w.Value, got[i].Value)
				}
				if len(w.Value) > 0 && strings.Contains(string(w.Value), `"***"`) {
					masked++
				}
			case berr != nil && werr != nil:
				if !errors.Is(werr, wasm.ErrRejected) || werr.Error() != berr.Error() {
					t.Errorf("config %v, value %q: built-in refused with %q, module with %q", cfg, w.Value, berr, werr)
				}
				refused++
			default:
				t.Errorf("config %v, value %q: built-in %v, module %v", cfg, w.Value, berr, werr)
			}
		}
		for _, in := range []interceptor.Instance{mod, builtin} {
			if in.Close != nil {
				in.Close()
			}
		}
	}
	if masked < 20 || refused < 20 {
		t.Fatalf("the corpus masked %d values and refused %d: too few to compare", masked, refused)
	}
	t.Logf("%d values: %d masked, %d refused, alike", len(corpus), masked, refused)
}

func configKey(c map[string]string) string {
	var ks []string
	for k, v := range c {
		ks = append(ks, fmt.Sprintf("%q=%q", k, v))
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}
