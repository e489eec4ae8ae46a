// Package wasm is Ferry's wasm interceptor (issue 20): a KIP-905
// interceptor whose logic is a WebAssembly module (WASI preview 1, ABI v1
// of package wasm/abi) loaded from the configuration and run in wazero,
// sandboxed: no file system, network or environment, clocks and
// randomness only when granted, memory capped, each call bounded by the
// chain's time budget. One call per record batch. See docs/INTERCEPTORS.md.
//
// Importing the package registers the interceptor as "wasm".
package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/wasm/abi"
)

// Name is the interceptor's registered name.
const Name = "wasm"

func init() {
	interceptor.Register(Name, New)
	interceptor.RegisterKeys(Name, interceptor.KeySet{Keys: append(Keys(), interceptor.KeyTopicPattern, interceptor.KeyTimeout),
		Prefixes: []string{KeyConfigPrefix}, Namespaces: []string{"wasm."}})
}

// ErrRejected is wrapped by the error of a record the module rejected
// (action REJECT); its message is the module's reason.
var ErrRejected = errors.New("rejected by the wasm module")

// rejection is a record the module rejected.
type rejection struct{ reason string }

func (r *rejection) Error() string { return r.reason }
func (r *rejection) Unwrap() error { return ErrRejected }

// New is the interceptor's Factory: it loads the module of
// wasm.module.path (see the Key* constants) and runs it on produce, fetch
// or both. Errors: a missing or invalid key, a file that is not a
// WebAssembly module, a module without the ABI's exports, one whose
// _initialize or ferry_init fails or runs over the time budget.
func New(ctx context.Context, config map[string]string) (interceptor.Instance, error) {
	s, err := parseSettings(config)
	if err != nil {
		return interceptor.Instance{}, err
	}
	re, err := interceptor.CompileTopicPattern(config[interceptor.KeyTopicPattern])
	if err != nil {
		return interceptor.Instance{}, err
	}
	env := interceptor.EnvFrom(ctx)
	m, err := load(ctx, s, env)
	if err != nil {
		return interceptor.Instance{}, err
	}
	produce, fetch := m.hasProduce, m.hasFetch
	switch s.side {
	case "produce":
		fetch = false
	case "fetch":
		produce = false
	}
	if s.side == "produce" && !m.hasProduce || s.side == "fetch" && !m.hasFetch || s.side == "both" && !(m.hasProduce && m.hasFetch) {
		_ = m.close()
		return interceptor.Instance{}, fmt.Errorf("%s=%s, but the module %s exports %s", KeySide, s.side, s.path, exportsOf(m))
	}
	in := interceptor.Instance{Close: m.close}
	if produce {
		in.Produce = &side{m: m, pattern: re, direction: observe.DirectionProduce}
	}
	if fetch {
		in.Fetch = &side{m: m, pattern: re, direction: observe.DirectionFetch}
	}
	return in, nil
}

func exportsOf(m *module) string {
	switch {
	case m.hasProduce && m.hasFetch:
		return abi.ProduceExport + " and " + abi.FetchExport
	case m.hasProduce:
		return "only " + abi.ProduceExport
	}
	return "only " + abi.FetchExport
}

// side is the module at produce or at fetch: a ProduceRequestInterceptor
// or FetchResponseInterceptor, and a BatchInterceptor.
type side struct {
	m         *module
	pattern   *regexp.Regexp
	direction string
}

func (s *side) Name() string                 { return Name }
func (s *side) TopicPattern() *regexp.Regexp { return s.pattern }

// ProcessRecord runs the module on a batch of one record (the chain calls
// ProcessBatch; this is for callers that go record by record).
func (s *side) ProcessRecord(ctx context.Context, r *interceptor.Record) error {
	errs, err := s.ProcessBatch(ctx, []*interceptor.Record{r})
	if err != nil {
		return err
	}
	if errs != nil {
		return errs[0]
	}
	return nil
}

// ProcessBatch runs the module once over recs (the records of one batch of
// one partition). An empty output leaves every record as it is. Errors
// (*Error, wrapping ErrModule): a trap, a call interrupted at the time
// budget, memory exhausted, a pointer outside the module's memory, output
// over wasm.output.max.bytes or not in the ABI's format; the instance is
// then replaced.
func (s *side) ProcessBatch(ctx context.Context, recs []*interceptor.Record) ([]error, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	m := s.m
	in, err := m.get(ctx)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Kind == KindTimeout {
			m.metrics.WasmFailure(m.name, s.direction, KindTimeout)
		}
		return nil, err
	}
	errs, kind, err := s.call(ctx, in, recs)
	if err != nil {
		if size := uint64(in.mem.Size()); kind == KindTrap && size > m.s.memoryMax/4*3 {
			// Trapped near its memory cap: a Go module's "out of memory"
			// (memory grows in chunks, so the last one did not fit).
			kind = KindMemory
			err = fmt.Errorf("%w (its memory is at %d bytes, near %s=%d)", err, size, KeyMemoryMax, m.s.memoryMax)
		}
		m.put(in, false)
		return nil, m.failure(s.direction, kind, err)
	}
	if err := m.charge(in); err != nil {
		m.put(in, false)
		return nil, m.failure(s.direction, KindMemory, err)
	}
	m.put(in, true)
	return errs, nil
}

// call passes recs to the module and applies its output.
func (s *side) call(ctx context.Context, in *instance, recs []*interceptor.Record) ([]error, string, error) {
	m := s.m
	size := abi.BatchHeaderSize(recs[0].Topic)
	for _, r := range recs {
		size += abi.RecordSize(r.Key, r.Value)
		for _, h := range r.Headers {
			size += abi.HeaderSize(h.Key, h.Value)
		}
	}
	ptr, kind, err := m.write(ctx, in, size, func(b []byte) { encode(b[:0], recs) })
	if err != nil {
		return nil, kind, err
	}
	fn, export := in.produce, abi.ProduceExport
	if s.direction == observe.DirectionFetch {
		fn, export = in.fetch, abi.FetchExport
	}
	in.stack[0], in.stack[1] = uint64(ptr), uint64(size)
	if err := fn.CallWithStack(ctx, in.stack); err != nil {
		return nil, kindOf(ctx, err), fmt.Errorf("%s: %w", export, describe(ctx, err))
	}
	optr, n := abi.UnpackResult(in.stack[0])
	if n == 0 {
		return nil, "", nil // every record unchanged
	}
	if n > m.s.outputMax {
		return nil, KindOutputTooLarge, fmt.Errorf("%s returned %d bytes, over %s=%d", export, n, KeyOutputMax, m.s.outputMax)
	}
	out, ok := in.mem.Read(optr, n)
	if !ok {
		return nil, KindBadPointer, fmt.Errorf("%s returned %d bytes at %d, outside its memory of %d bytes", export, n, optr, in.mem.Size())
	}
	res, err := abi.DecodeOutput(out, len(recs))
	if err != nil {
		return nil, KindMalformedOutput, fmt.Errorf("%s's output: %w", export, err)
	}
	return apply(recs, res), "", nil
}

// encode writes the input batch into dst's capacity (the module's memory).
func encode(dst []byte, recs []*interceptor.Record) {
	dst = abi.AppendBatchHeader(dst, recs[0].Topic, recs[0].Partition, len(recs))
	for _, r := range recs {
		dst = abi.AppendRecordHead(dst, r.Offset, r.Timestamp, r.Key, r.Value, len(r.Headers))
		for _, h := range r.Headers {
			dst = abi.AppendHeader(dst, h.Key, h.Value)
		}
	}
}

// apply applies the results to recs, copying what they hold out of the
// module's memory; nil when every record was kept.
func apply(recs []*interceptor.Record, res []abi.Result) []error {
	var errs []error
	for i := range res {
		r, rec := &res[i], recs[i]
		var e error
		switch r.Action {
		case abi.Keep:
			continue
		case abi.Replace:
			rec.Key, rec.Value = bytes.Clone(r.Key), bytes.Clone(r.Value)
			rec.Headers = rec.Headers[:0:0]
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, interceptor.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
			}
			continue
		case abi.Skip:
			e = interceptor.ErrSkipRecord
		case abi.Reject:
			e = &rejection{reason: r.Reason}
		}
		if errs == nil {
			errs = make([]error, len(recs))
		}
		errs[i] = e
	}
	return errs
}
