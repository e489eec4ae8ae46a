package wasm

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/interceptor"
)

// passthrough is a built-in-style interceptor that changes nothing: the
// chain's own cost, to compare the modules with.
type passthrough struct{}

func (passthrough) Name() string                                             { return "passthrough" }
func (passthrough) TopicPattern() *regexp.Regexp                             { return regexp.MustCompile(".*") }
func (passthrough) ProcessRecord(context.Context, *interceptor.Record) error { return nil }

// BenchmarkProduceBatch: one produce partition of a batch of 100 records
// of 1 KiB through the chain, per module; ns/record is the per-record
// cost (docs/BENCHMARKS.md). "go" is a no-op Go interceptor, for the
// chain's own cost; "noop" a module returning len 0 (one call per batch,
// the batch copied into the module); "upper" a module replacing every
// value (output decoded and applied, the batch re-encoded).
func BenchmarkProduceBatch(b *testing.B) {
	vals := make([]string, 100)
	for i := range vals {
		vals[i] = strings.Repeat("x", 1024)
	}
	set := batches(b, true, vals...)
	chains := map[string]*interceptor.Chain{
		"go": interceptor.NewChain([]interceptor.Instance{{Produce: passthrough{}}}, interceptor.Options{}),
	}
	for _, name := range []string{"noop", "upper"} {
		ch, err := build(b, name, nil, interceptor.Options{})
		if err != nil {
			b.Fatal(err)
		}
		chains[name] = ch
	}
	for _, name := range []string{"go", "noop", "upper"} {
		b.Run(name, func(b *testing.B) {
			ch := chains[name]
			b.SetBytes(int64(len(set)))
			b.ReportAllocs()
			for b.Loop() {
				out, _ := produce(ch, set)
				if len(out.Answered) > 0 {
					b.Fatal(out.Answered[0].Err)
				}
				out.Release()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(vals)), "ns/record")
		})
	}
}
