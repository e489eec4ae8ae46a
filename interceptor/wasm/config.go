package wasm

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
)

// Configuration keys of the wasm interceptor (docs/INTERCEPTORS.md, "The
// wasm interceptor"); topic.pattern as for the built-ins.
const (
	// KeyModulePath is the WebAssembly module's file (WASI preview 1
	// reactor, ABI v1). Required. Read and compiled once when the chain is
	// built (start-up, and each reload: SIGHUP picks up a changed file).
	KeyModulePath = "wasm.module.path"
	// KeySide narrows where the module runs: produce, fetch or both
	// (default: where it exports ferry_on_produce / ferry_on_fetch).
	KeySide = "wasm.side"
	// KeyInstancesMax is how many instances of the module may run at once
	// (calls beyond wait for one, within the chain's time budget). Default
	// GOMAXPROCS: a call is CPU-bound.
	KeyInstancesMax = "wasm.instances.max"
	// KeyMemoryMax caps one instance's linear memory, in bytes (rounded
	// down to 64 KiB pages). Default DefaultMemoryMax.
	KeyMemoryMax = "wasm.memory.max.bytes"
	// KeyOutputMax bounds one call's output (the bytes of its output
	// batch), in bytes. Default DefaultOutputMax.
	KeyOutputMax = "wasm.output.max.bytes"
	// KeyAllowClock grants the module the host's clocks (default false: a
	// fixed fake clock). Sleeping is never granted.
	KeyAllowClock = "wasm.allow.clock"
	// KeyAllowRandom grants the module crypto/rand (default false: a
	// deterministic source).
	KeyAllowRandom = "wasm.allow.random"
	// KeyConfigPrefix: every key wasm.config.NAME is handed to the
	// module's ferry_init as NAME.
	KeyConfigPrefix = "wasm.config."
)

// Defaults of the bounds.
const (
	// DefaultMemoryMax is 64 MiB: a Go-built module (its runtime and heap
	// start near 2-4 MiB) holding a batch of a few MiB, its decoded
	// records and its output, with room for its GC.
	DefaultMemoryMax = 64 << 20
	// DefaultOutputMax is 16 MiB.
	DefaultOutputMax = 16 << 20
	pageSize         = 64 << 10
)

// Keys returns the configuration keys the wasm interceptor reads, besides
// topic.pattern and the wasm.config.* keys.
func Keys() []string {
	return []string{KeyModulePath, KeySide, KeyInstancesMax, KeyMemoryMax, KeyOutputMax, KeyAllowClock, KeyAllowRandom}
}

// settings is a parsed configuration.
type settings struct {
	path                string
	side                string // "", produce, fetch, both
	instances           int
	memoryMax           uint64
	outputMax           uint32
	allowClock, allowRN bool
	module              map[string]string // wasm.config.* without the prefix
}

func parseSettings(config map[string]string) (settings, error) {
	s := settings{instances: runtime.GOMAXPROCS(0), memoryMax: DefaultMemoryMax, outputMax: DefaultOutputMax,
		module: map[string]string{}}
	known := Keys()
	for k, v := range config {
		if rest, ok := strings.CutPrefix(k, KeyConfigPrefix); ok {
			s.module[rest] = v
			continue
		}
		if strings.HasPrefix(k, "wasm.") && !contains(known, k) {
			return s, fmt.Errorf("unknown key %s (known: %s, %s*)", k, strings.Join(known, ", "), KeyConfigPrefix)
		}
	}
	s.path = strings.TrimSpace(config[KeyModulePath])
	if s.path == "" {
		return s, fmt.Errorf("%s is required: the WebAssembly module to run", KeyModulePath)
	}
	switch v := strings.ToLower(strings.TrimSpace(config[KeySide])); v {
	case "", "produce", "fetch", "both":
		s.side = v
	default:
		return s, fmt.Errorf("%s: %q is not produce, fetch or both", KeySide, config[KeySide])
	}
	var err error
	if s.instances, err = intKey(config, KeyInstancesMax, int64(s.instances), 1, 1024); err != nil {
		return s, err
	}
	mm, err := intKey(config, KeyMemoryMax, DefaultMemoryMax, pageSize, 4<<30)
	if err != nil {
		return s, err
	}
	s.memoryMax = uint64(mm) / pageSize * pageSize
	om, err := intKey(config, KeyOutputMax, DefaultOutputMax, 4, 4<<30-1)
	if err != nil {
		return s, err
	}
	s.outputMax = uint32(om)
	if s.allowClock, err = boolKey(config, KeyAllowClock); err != nil {
		return s, err
	}
	if s.allowRN, err = boolKey(config, KeyAllowRandom); err != nil {
		return s, err
	}
	return s, nil
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

func intKey(config map[string]string, key string, def, lo, hi int64) (int, error) {
	v := strings.TrimSpace(config[key])
	if v == "" {
		return int(def), nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: %q is not a number from %d to %d", key, config[key], lo, hi)
	}
	return int(n), nil
}

func boolKey(config map[string]string, key string) (bool, error) {
	v := strings.TrimSpace(config[key])
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %q is not true or false", key, config[key])
	}
	return b, nil
}
