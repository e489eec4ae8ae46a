package wasm

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/observe"
)

// build builds a chain of one wasm interceptor with module testdata/NAME.wasm.
func build(t testing.TB, name string, extra map[string]string, o interceptor.Options) (*interceptor.Chain, error) {
	t.Helper()
	cfg := map[string]string{KeyModulePath: "testdata/" + name + ".wasm"}
	for k, v := range extra {
		cfg[k] = v
	}
	ch, err := interceptor.Build(context.Background(), []interceptor.Spec{{Name: Name, Config: cfg}}, o)
	if err == nil {
		t.Cleanup(func() { ch.Close() })
	}
	return ch, err
}

// direct loads testdata/NAME.wasm as an Instance, for calls without a chain.
func direct(t *testing.T, name string, extra map[string]string) interceptor.Instance {
	t.Helper()
	cfg := map[string]string{KeyModulePath: "testdata/" + name + ".wasm"}
	for k, v := range extra {
		cfg[k] = v
	}
	in, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	return in
}

func recs(values ...string) []*interceptor.Record {
	var out []*interceptor.Record
	for i, v := range values {
		out = append(out, &interceptor.Record{Topic: "t", Partition: 3, Key: []byte("k"), Value: []byte(v), Offset: int64(i),
			Headers: []interceptor.Header{{Key: "h", Value: []byte("x")}, {Key: "n"}}})
	}
	return out
}

func TestUpperDirect(t *testing.T) {
	in := direct(t, "upper", nil)
	b := in.Produce.(interceptor.BatchInterceptor)
	rs := recs("hello", "Wörld 1", "")
	rs[2].Value = nil
	errs, err := b.ProcessBatch(context.Background(), rs)
	if err != nil || errs != nil {
		t.Fatal(errs, err)
	}
	if string(rs[0].Value) != "HELLO" || string(rs[1].Value) != "WöRLD 1" || rs[2].Value != nil {
		t.Fatalf("values %q %q %v", rs[0].Value, rs[1].Value, rs[2].Value)
	}
	if string(rs[0].Key) != "k" || len(rs[0].Headers) != 2 || string(rs[0].Headers[0].Value) != "x" || rs[0].Headers[1].Value != nil {
		t.Fatalf("key/headers changed: %q %+v", rs[0].Key, rs[0].Headers)
	}
	// A batch larger than the first page: the module's memory grows.
	big := recs(strings.Repeat("a", 300<<10))
	if _, err := b.ProcessBatch(context.Background(), big); err != nil || string(big[0].Value[:3]) != "AAA" {
		t.Fatal(err)
	}
}

func TestNoopDirect(t *testing.T) {
	in := direct(t, "noop", nil)
	rs := recs("a", "b")
	before := rs[0]
	errs, err := in.Fetch.(interceptor.BatchInterceptor).ProcessBatch(context.Background(), rs)
	if err != nil || errs != nil || rs[0] != before || string(rs[0].Value) != "a" {
		t.Fatal(errs, err)
	}
}

func TestRefusedModules(t *testing.T) {
	for name, want := range map[string]string{
		"noexports":  "does not export ferry_abi_v1",
		"initrefuse": "bad config: want mode",
		"initloop":   "interrupted",
		"missing":    "no such file",
	} {
		_, err := build(t, name, nil, interceptor.Options{Timeout: 300 * time.Millisecond})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", name, err, want)
		}
	}
	if err := func() error {
		_, err := New(context.Background(), map[string]string{KeyModulePath: "testdata/upper.wat"})
		return err
	}(); err == nil || !strings.Contains(err.Error(), "not a valid WebAssembly module") {
		t.Errorf("WAT text: %v", err)
	}
	if _, err := New(context.Background(), map[string]string{KeyModulePath: "testdata/noop.wasm", "wasm.memroy.max.bytes": "1"}); err == nil || !strings.Contains(err.Error(), "unknown key") {
		t.Errorf("misspelled key: %v", err)
	}
	if _, err := New(context.Background(), map[string]string{KeyModulePath: "testdata/loop.wasm", KeySide: "fetch"}); err == nil || !strings.Contains(err.Error(), "exports only ferry_on_produce") {
		t.Errorf("side: %v", err)
	}
}

// TestHostile: each hostile module fails its partition with a clear error
// of its kind, counted; the failed instance is replaced (the next call
// fails the same way, not stuck) and its memory given back; a module that
// never returns is interrupted at the chain's budget and its goroutine
// ends.
func TestHostile(t *testing.T) {
	m, err := observe.NewMetrics(nil, observe.MetricsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	set := batches(t, true, "hello", "world")
	for name, want := range map[string]string{
		"trap":     KindTrap,
		"grow":     KindMemory,
		"badptr":   KindBadPointer,
		"huge":     KindOutputTooLarge,
		"badalloc": KindBadPointer,
		"loop":     KindTimeout,
	} {
		t.Run(name, func(t *testing.T) {
			mem := interceptor.NewMemory(64 << 20)
			const memMax = 4 << 20
			ch, err := build(t, name, map[string]string{KeyMemoryMax: "4194304", KeyInstancesMax: "2"},
				interceptor.Options{Metrics: m, Memory: mem, Timeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			base := runtime.NumGoroutine()
			for call := 1; call <= 2; call++ {
				start := time.Now()
				out, _ := produce(ch, set)
				if len(out.Answered) != 1 {
					t.Fatalf("call %d: %+v", call, out)
				}
				a := out.Answered[0]
				if name == "loop" {
					if a.ErrorCode != kerr.RequestTimedOut.Code || time.Since(start) > 30*time.Second {
						t.Fatalf("call %d: %d %s after %s", call, a.ErrorCode, a.ErrorMessage, time.Since(start))
					}
				} else if a.ErrorCode != kerr.InvalidRecord.Code || !strings.Contains(a.ErrorMessage, name+".wasm: "+want) ||
					!strings.Contains(a.ErrorMessage, "topic t partition 0") {
					t.Fatalf("call %d: %d %q", call, a.ErrorCode, a.ErrorMessage)
				}
				if !errors.Is(a.Err, ErrModule) && name != "loop" {
					t.Fatalf("call %d: %v does not wrap ErrModule", call, a.Err)
				}
				out.Release()
			}
			// Counted (the loop's when its interrupted call returns), the
			// failed instances closed, their memory given back, the
			// interrupted goroutines ended.
			deadline := time.Now().Add(30 * time.Second)
			for failures(m, name+".wasm", "produce", want) < 2 || mem.InUse() > 2*memMax || runtime.NumGoroutine() > base+2 {
				if time.Now().After(deadline) {
					t.Fatalf("failures %v, memory in use %d, goroutines %d (base %d)", failures(m, name+".wasm", "produce", want),
						mem.InUse(), runtime.NumGoroutine(), base)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
