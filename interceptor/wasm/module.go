package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/wasm/abi"
)

// Kinds of failure (the kind label of ferry_wasm_failures_total).
const (
	KindTrap            = "trap"             // the module trapped or exited
	KindTimeout         = "timeout"          // interrupted at the chain's time budget
	KindMemory          = "memory"           // out of its memory (wasm.memory.max.bytes) or of the proxy's budget
	KindBadPointer      = "bad_pointer"      // a pointer/length outside its memory
	KindOutputTooLarge  = "output_too_large" // output over wasm.output.max.bytes
	KindMalformedOutput = "malformed_output" // output not in the ABI's format
	KindInit            = "init"             // _initialize or ferry_init failed, or timed out
)

// ErrModule is wrapped by every failure of a module call; Error gives its
// kind.
var ErrModule = errors.New("wasm module failed")

// Error is a failed module call: the partition fails, and the instance is
// replaced.
type Error struct {
	Module string // the module's file name
	Kind   string // Kind*
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("wasm module %s: %s: %v", e.Module, e.Kind, e.Err)
}

func (e *Error) Unwrap() []error { return []error{ErrModule, e.Err} }

// module is a compiled module and its pool of instances.
type module struct {
	name, path string
	s          settings
	rt         wazero.Runtime
	compiled   wazero.CompiledModule
	modCfg     wazero.ModuleConfig
	config     []byte // ferry_init's input
	hasInit    bool
	hasProduce bool
	hasFetch   bool
	hasSides   bool // exports ferry_sides
	mem        *interceptor.Memory
	metrics    *observe.Metrics
	logs       *logWriter

	slots chan struct{} // one per instance in use or idle: cap is wasm.instances.max
	idle  chan *instance

	mu     sync.Mutex
	closed bool
	live   map[*instance]struct{}
}

// instance is one instantiated module.
type instance struct {
	mod     api.Module
	mem     api.Memory
	alloc   api.Function
	produce api.Function
	fetch   api.Function
	stack   []uint64 // CallWithStack's, reused
	charged int64    // bytes of its memory charged to the proxy's budget
}

// load reads, compiles and checks the module of s, and makes a first
// instance (running its _initialize and ferry_init) so that a module that
// cannot start is refused at once.
func load(ctx context.Context, s settings, env interceptor.BuildEnv) (*module, error) {
	code, err := os.ReadFile(s.path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyModulePath, err)
	}
	m := &module{name: filepath.Base(s.path), path: s.path, s: s, mem: env.Memory, metrics: env.Metrics,
		slots: make(chan struct{}, s.instances), idle: make(chan *instance, s.instances), live: map[*instance]struct{}{}}
	m.logs = newLogWriter(m.name)
	rc := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(uint32(s.memoryMax / pageSize))
	m.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	fail := func(err error) (*module, error) {
		_ = m.rt.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, m.rt); err != nil {
		return fail(err)
	}
	if m.compiled, err = m.rt.CompileModule(ctx, code); err != nil {
		return fail(fmt.Errorf("%s %s: not a valid WebAssembly module: %w", KeyModulePath, s.path, err))
	}
	if err := m.checkExports(); err != nil {
		return fail(fmt.Errorf("%s %s: %w", KeyModulePath, s.path, err))
	}
	m.config = abi.EncodeConfig(s.module)
	mc := wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize").
		WithStdout(m.logs).WithStderr(m.logs)
	if s.allowClock {
		mc = mc.WithSysWalltime().WithSysNanotime()
	}
	if s.allowRN {
		mc = mc.WithRandSource(rand.Reader)
	}
	m.modCfg = mc
	ictx, cancel := context.WithTimeout(ctx, env.Timeout)
	defer cancel()
	m.slots <- struct{}{}
	in, err := m.instantiate(ictx)
	if err != nil {
		return fail(err)
	}
	if m.hasSides {
		// A module may export both sides and use one (the Go SDK exports
		// every function it has): ferry_sides, asked once after ferry_init,
		// narrows them, so a side it does not use costs no call.
		if err := in.mod.ExportedFunction(abi.SidesExport).CallWithStack(ictx, in.stack); err != nil {
			m.discard(in)
			return fail(m.failure("init", KindInit, fmt.Errorf("%s: %w", abi.SidesExport, describe(ictx, err))))
		}
		bits := uint32(in.stack[0])
		m.hasProduce = m.hasProduce && bits&abi.SideProduce != 0
		m.hasFetch = m.hasFetch && bits&abi.SideFetch != 0
		if !m.hasProduce && !m.hasFetch {
			m.discard(in)
			return fail(fmt.Errorf("%s %s: %s reports no side it has a function for (%#x): it would do nothing", KeyModulePath, s.path, abi.SidesExport, bits))
		}
	}
	m.put(in, true)
	return m, nil
}

// checkExports checks the ABI's required exports and their signatures.
func (m *module) checkExports() error {
	fns := m.compiled.ExportedFunctions()
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	want := []struct {
		name     string
		required bool
		params   []api.ValueType
		results  []api.ValueType
		has      *bool
	}{
		{abi.VersionExport, true, nil, nil, nil},
		{abi.AllocExport, true, []api.ValueType{i32}, []api.ValueType{i32}, nil},
		{abi.InitExport, false, []api.ValueType{i32, i32}, []api.ValueType{i64}, &m.hasInit},
		{abi.ProduceExport, false, []api.ValueType{i32, i32}, []api.ValueType{i64}, &m.hasProduce},
		{abi.FetchExport, false, []api.ValueType{i32, i32}, []api.ValueType{i64}, &m.hasFetch},
		{abi.SidesExport, false, nil, []api.ValueType{i32}, &m.hasSides},
	}
	for _, w := range want {
		f, ok := fns[w.name]
		if !ok {
			if w.required {
				return fmt.Errorf("the module does not export %s: it is not a Ferry interceptor module of ABI v%d (docs/INTERCEPTORS.md)", w.name, abi.Version)
			}
			continue
		}
		if !sameTypes(f.ParamTypes(), w.params) || !sameTypes(f.ResultTypes(), w.results) {
			return fmt.Errorf("export %s has type %v -> %v, ABI v%d wants %v -> %v", w.name,
				names(f.ParamTypes()), names(f.ResultTypes()), abi.Version, names(w.params), names(w.results))
		}
		if w.has != nil {
			*w.has = true
		}
	}
	if _, ok := m.compiled.ExportedMemories()[abi.MemoryExport]; !ok {
		return fmt.Errorf("the module exports no memory named %q (ABI v%d)", abi.MemoryExport, abi.Version)
	}
	if !m.hasProduce && !m.hasFetch {
		return fmt.Errorf("the module exports neither %s nor %s: it would do nothing", abi.ProduceExport, abi.FetchExport)
	}
	return nil
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func names(ts []api.ValueType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = api.ValueTypeName(t)
	}
	return out
}

// instantiate makes an instance: _initialize, then ferry_init with the
// configuration, its memory charged to the proxy's budget. The caller
// holds a slot.
func (m *module) instantiate(ctx context.Context) (*instance, error) {
	mod, err := m.rt.InstantiateModule(ctx, m.compiled, m.modCfg)
	if err != nil {
		return nil, m.failure("init", KindInit, fmt.Errorf("instantiating (_initialize): %w", describe(ctx, err)))
	}
	in := &instance{mod: mod, mem: mod.Memory(), alloc: mod.ExportedFunction(abi.AllocExport),
		produce: mod.ExportedFunction(abi.ProduceExport), fetch: mod.ExportedFunction(abi.FetchExport), stack: make([]uint64, 2)}
	m.mu.Lock()
	m.live[in] = struct{}{}
	m.mu.Unlock()
	if err := m.charge(in); err != nil {
		m.discard(in)
		return nil, m.failure("init", KindMemory, err)
	}
	if m.hasInit {
		if err := m.initInstance(ctx, in); err != nil {
			m.discard(in)
			return nil, err
		}
	}
	return in, nil
}

// initInstance calls ferry_init with the configuration.
func (m *module) initInstance(ctx context.Context, in *instance) error {
	ptr, kind, err := m.write(ctx, in, len(m.config), func(b []byte) { copy(b, m.config) })
	if err != nil {
		return m.failure("init", kind, fmt.Errorf("writing the configuration: %w", err))
	}
	in.stack[0], in.stack[1] = uint64(ptr), uint64(len(m.config))
	if err := in.mod.ExportedFunction(abi.InitExport).CallWithStack(ctx, in.stack); err != nil {
		return m.failure("init", KindInit, fmt.Errorf("%s: %w", abi.InitExport, describe(ctx, err)))
	}
	optr, n := abi.UnpackResult(in.stack[0])
	if n == 0 {
		return m.charge(in)
	}
	msg, ok := in.mem.Read(optr, min(n, 4096))
	if !ok {
		return m.failure("init", KindBadPointer, fmt.Errorf("%s returned an error message at %d (+%d) outside its memory of %d bytes", abi.InitExport, optr, n, in.mem.Size()))
	}
	return m.failure("init", KindInit, fmt.Errorf("the module refused its configuration: %s", msg))
}

// write has the module allocate n bytes (ferry_alloc) and fill them.
func (m *module) write(ctx context.Context, in *instance, n int, fill func([]byte)) (uint32, string, error) {
	if uint64(n) > uint64(m.s.memoryMax) {
		return 0, KindMemory, fmt.Errorf("%d bytes to pass do not fit its memory of at most %d bytes (%s)", n, m.s.memoryMax, KeyMemoryMax)
	}
	in.stack[0] = uint64(uint32(n))
	if err := in.alloc.CallWithStack(ctx, in.stack); err != nil {
		return 0, kindOf(ctx, err), fmt.Errorf("%s(%d): %w", abi.AllocExport, n, describe(ctx, err))
	}
	ptr := uint32(in.stack[0])
	if ptr == 0 && n > 0 {
		return 0, KindMemory, fmt.Errorf("%s(%d) returned 0: out of memory (%s=%d)", abi.AllocExport, n, KeyMemoryMax, m.s.memoryMax)
	}
	buf, ok := in.mem.Read(ptr, uint32(n))
	if !ok {
		return 0, KindBadPointer, fmt.Errorf("%s(%d) returned %d, outside its memory of %d bytes", abi.AllocExport, n, ptr, in.mem.Size())
	}
	fill(buf)
	return ptr, "", nil
}

// charge charges the growth of in's memory to the proxy's budget.
func (m *module) charge(in *instance) error {
	size := int64(in.mem.Size())
	if d := size - in.charged; d > 0 {
		if !m.mem.TryTake(d) {
			return fmt.Errorf("%w: its memory grew to %d bytes and the budget has no room for %d more", interceptor.ErrMemoryBusy, size, d)
		}
		in.charged = size
	}
	return nil
}

// get takes an instance: an idle one, or a new one while fewer than
// wasm.instances.max exist, else waits for one until ctx ends.
func (m *module) get(ctx context.Context) (*instance, error) {
	select {
	case in := <-m.idle:
		return in, nil
	default:
	}
	select {
	case m.slots <- struct{}{}:
	case in := <-m.idle:
		return in, nil
	case <-ctx.Done():
		return nil, &Error{Module: m.name, Kind: KindTimeout, Err: fmt.Errorf("waiting for one of its %d instances (%s): %w", m.s.instances, KeyInstancesMax, ctx.Err())}
	}
	select {
	case in := <-m.idle: // one came back meanwhile: the slot is not needed
		<-m.slots
		return in, nil
	default:
	}
	in, err := m.instantiate(ctx)
	if err != nil {
		<-m.slots
		return nil, err
	}
	return in, nil
}

// put gives an instance back; a failed one (ok false) is closed and its
// slot freed, so the next call makes a fresh one.
func (m *module) put(in *instance, ok bool) {
	m.mu.Lock()
	if ok && !m.closed {
		m.idle <- in // never blocks: idle holds as many as there are slots; under mu, so close drains it
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.discard(in)
	<-m.slots
}

// discard closes an instance and gives its memory back.
func (m *module) discard(in *instance) {
	m.mu.Lock()
	_, live := m.live[in]
	delete(m.live, in)
	m.mu.Unlock()
	if !live {
		return
	}
	_ = in.mod.Close(context.Background())
	m.mem.Give(in.charged)
	in.charged = 0
}

// close closes the idle instances and the runtime; instances in use are
// closed with it (their calls fail) and given back.
func (m *module) close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	for {
		select {
		case in := <-m.idle:
			m.discard(in)
			continue
		default:
		}
		break
	}
	m.mu.Lock()
	var rest []*instance
	for in := range m.live {
		rest = append(rest, in)
	}
	m.mu.Unlock()
	for _, in := range rest {
		m.discard(in)
	}
	return m.rt.Close(context.Background())
}

// failure counts and returns a failure of kind in direction.
func (m *module) failure(direction, kind string, err error) *Error {
	m.metrics.WasmFailure(m.name, direction, kind)
	return &Error{Module: m.name, Kind: kind, Err: err}
}

// kindOf classifies an error of a call: interrupted at ctx's end (the
// chain's time budget) or a trap.
func kindOf(ctx context.Context, err error) string {
	var ee *sys.ExitError
	if errors.As(err, &ee) && (ee.ExitCode() == sys.ExitCodeDeadlineExceeded || ee.ExitCode() == sys.ExitCodeContextCanceled) {
		return KindTimeout
	}
	if ctx.Err() != nil {
		return KindTimeout
	}
	return KindTrap
}

// describe makes a call's error readable: an interrupted call says so.
func describe(ctx context.Context, err error) error {
	if kindOf(ctx, err) == KindTimeout {
		return fmt.Errorf("interrupted at the chain's time budget (%s): %w", interceptor.KeyTimeout, err)
	}
	return err
}
