// Package sdk writes a Ferry WebAssembly interceptor as ordinary Go
// functions. A module is a package main that registers its functions in
// init and is built with Go's standard toolchain as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o uppercase.wasm ./examples/wasm/uppercase
//
// It is loaded by the proxy's wasm interceptor (wasm.module.path; see
// docs/INTERCEPTORS.md, "Writing a WebAssembly interceptor"):
//
//	package main
//
//	import (
//		"bytes"
//
//		"github.com/ferrykit/ferry/wasm/sdk"
//	)
//
//	func init() {
//		sdk.OnProduce(func(r *sdk.Record) sdk.Result {
//			r.Value = bytes.ToUpper(r.Value)
//			return sdk.Keep()
//		})
//	}
//
//	func main() {} // never called: the host calls the module's exports
//
// The package implements the guest side of ABI version 1 (package
// wasm/abi): it exports ferry_abi_v1, ferry_alloc, ferry_init,
// ferry_on_produce, ferry_on_fetch and ferry_sides (the sides that have a
// function). Functions run one call at a time (the host pools instances
// for concurrency), so they may keep state in package variables without
// locks; a function that panics fails its batch's partition and the host
// replaces the instance, the panic's message in the proxy's log.
package sdk

import (
	"github.com/ferrykit/ferry/wasm/abi"
)

// Header is a record header (Kafka's: a string key, a byte value; a nil
// Value is null).
type Header = abi.Header

// Record is the record a function sees. Change it by assigning Key, Value
// or Headers (r.Value = bytes.ToUpper(r.Value); r.Headers = append(...));
// the bytes of Key, Value and header values are the host's input and
// must not be written in place (a change made that way is not seen and
// the record is kept as it came). A nil Key or Value is Kafka's null,
// distinct from empty. Topic, Partition, Offset and Timestamp are
// information; changes to them are ignored. The Record and its slices
// are valid only during the call: copy what you keep.
type Record struct {
	Topic     string
	Partition int32
	// Offset is the record's offset on fetch; on produce the broker has
	// not assigned one and Offset is the record's index in its batch.
	Offset int64
	// Timestamp is the record's timestamp in ms since the epoch.
	Timestamp int64
	Key       []byte
	Value     []byte
	Headers   []Header
}

// Header returns the value of the last header named key, and whether
// there is one (Kafka allows a key more than once; the last wins as in
// most clients' lastHeader).
func (r *Record) Header(key string) ([]byte, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return r.Headers[i].Value, true
		}
	}
	return nil, false
}

// SetHeader gives the record exactly one header named key, with value:
// the first one with that key is replaced and later ones removed, or the
// header is appended. It never writes into the input's header list.
func (r *Record) SetHeader(key string, value []byte) {
	hs := make([]Header, 0, len(r.Headers)+1)
	set := false
	for _, h := range r.Headers {
		if h.Key != key {
			hs = append(hs, h)
		} else if !set {
			hs = append(hs, Header{Key: key, Value: value})
			set = true
		}
	}
	if !set {
		hs = append(hs, Header{Key: key, Value: value})
	}
	r.Headers = hs
}

// Result is what a function does with its record: Keep, Skip or Reject.
type Result struct {
	action abi.Action
	reason string
}

// Keep keeps the record as the function left it: unchanged, or with the
// key, value and headers it assigned.
func Keep() Result { return Result{action: abi.Keep} }

// Skip drops the record (KIP-905's skip). On produce the host honours it
// only in batches without a producer id (idempotent and transactional
// batches would break their sequence numbers): there the partition fails
// with INVALID_RECORD, as for the proxy's built-in interceptors.
func Skip() Result { return Result{action: abi.Skip} }

// Reject fails the record: on produce its partition fails with
// INVALID_RECORD and reason as the record's error message (the producer
// sees it); on fetch the partition of that fetch fails.
func Reject(reason string) Result { return Result{action: abi.Reject, reason: reason} }

// Func is a produce or fetch function.
type Func func(r *Record) Result

var (
	initFn    func(config map[string]string) error
	produceFn Func
	fetchFn   Func
)

// OnInit registers fn, called once per instance before any record with
// the interceptor's wasm.config.* entries (the prefix removed: a config
// key wasm.config.tag.value arrives as tag.value). An error refuses the
// module: the proxy does not load it (at start, the proxy does not start;
// at a reload, the old module is kept) and logs the message. OnInit may
// call OnProduce and OnFetch to choose the sides from the configuration.
func OnInit(fn func(config map[string]string) error) { initFn = fn }

// OnProduce registers fn to run on every record of the produce requests
// of the topics the interceptor matches (topic.pattern). nil removes it.
func OnProduce(fn Func) { produceFn = fn }

// OnFetch registers fn to run on every record of the fetch responses of
// the topics the interceptor matches. nil removes it.
func OnFetch(fn Func) { fetchFn = fn }

// Sides reported by ferry_sides.
const (
	sideProduce = 1 << 0
	sideFetch   = 1 << 1
)

// sides returns the sides that have a function.
func sides() int32 {
	var s int32
	if produceFn != nil {
		s |= sideProduce
	}
	if fetchFn != nil {
		s |= sideFetch
	}
	return s
}
