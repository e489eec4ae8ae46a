// Package abi is the codec of Ferry's WebAssembly interceptor ABI, version
// 1, shared by the host (package interceptor/wasm, which runs modules in
// the proxy) and the guest SDK (package wasm/sdk, compiled into modules).
// It is portable Go without dependencies, so a module built with
// GOOS=wasip1 GOARCH=wasm stays small. The ABI is described in
// docs/INTERCEPTORS.md ("The wasm interceptor").
//
// All integers are little-endian. A null key, value or header value is
// length -1 (Kafka's null, distinct from empty). Decoded slices alias the
// input: a caller that keeps them past the input's life copies them.
package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
)

// Version is the ABI version: a module declares it by exporting the
// function named VersionExport.
const Version = 1

// Names of the module's exports (see docs/INTERCEPTORS.md).
const (
	VersionExport = "ferry_abi_v1"     // func(); required: declares ABI version 1
	AllocExport   = "ferry_alloc"      // func(size i32) i32; required; 0 = out of memory
	InitExport    = "ferry_init"       // func(ptr, len i32) i64; optional
	ProduceExport = "ferry_on_produce" // func(ptr, len i32) i64; optional
	FetchExport   = "ferry_on_fetch"   // func(ptr, len i32) i64; optional
	SidesExport   = "ferry_sides"      // func() i32; optional: bit 0 produce, bit 1 fetch, asked once after ferry_init
	MemoryExport  = "memory"           // required

	// SideProduce and SideFetch are the bits of SidesExport's result.
	SideProduce = 1
	SideFetch   = 2
)

// Action is what a module does with one record of a batch.
type Action uint8

const (
	// Keep leaves the record unchanged.
	Keep Action = 0
	// Replace gives the record a new key, value and headers.
	Replace Action = 1
	// Skip drops the record (KIP-905's skip; on produce only in batches
	// without a producer id, as interceptor.ErrSkipRecord).
	Skip Action = 2
	// Reject fails the record's partition with a reason: on produce
	// INVALID_RECORD with the reason as the record's record_errors message.
	Reject Action = 3
)

func (a Action) String() string {
	switch a {
	case Keep:
		return "keep"
	case Replace:
		return "replace"
	case Skip:
		return "skip"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ErrMalformed is wrapped by every decoding error: the bytes do not follow
// the ABI (short, trailing bytes, a length past the end, an unknown action,
// a record count other than the input's).
var ErrMalformed = errors.New("malformed ABI data")

// Header is a record header; a nil Value is null.
type Header struct {
	Key   string
	Value []byte
}

// Record is one record of an input batch. Offset is the record's offset
// on fetch and its index in its batch on produce; Timestamp is in ms since
// the epoch.
type Record struct {
	Offset    int64
	Timestamp int64
	Key       []byte
	Value     []byte
	Headers   []Header
}

// Batch is the input of ferry_on_produce / ferry_on_fetch: the records of
// one record batch of one partition.
type Batch struct {
	Topic     string
	Partition int32
	Records   []Record
}

// Result is what a module did with one record: Key, Value and Headers
// are set for Replace, Reason for Reject.
type Result struct {
	Action  Action
	Key     []byte
	Value   []byte
	Headers []Header
	Reason  string
}

// PackResult packs a pointer and length into the i64 the ferry_* exports
// return: (ptr << 32) | len.
func PackResult(ptr, n uint32) uint64 { return uint64(ptr)<<32 | uint64(n) }

// UnpackResult is PackResult's inverse.
func UnpackResult(v uint64) (ptr, n uint32) { return uint32(v >> 32), uint32(v) }

// --- encoding ---

func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

// appendNullable appends an i32 length (-1 for nil) and the bytes.
func appendNullable(b, v []byte) []byte {
	if v == nil {
		return appendU32(b, math.MaxUint32)
	}
	return append(appendU32(b, uint32(len(v))), v...)
}

func appendString(b []byte, s string) []byte { return append(appendU32(b, uint32(len(s))), s...) }

// AppendBatchHeader appends the start of an input batch: topic, partition
// and the number of records that follow (each by AppendRecord).
func AppendBatchHeader(dst []byte, topic string, partition int32, n int) []byte {
	dst = appendString(dst, topic)
	dst = appendU32(dst, uint32(partition))
	return appendU32(dst, uint32(n))
}

// BatchHeaderSize is AppendBatchHeader's length.
func BatchHeaderSize(topic string) int { return 12 + len(topic) }

// AppendRecord appends one record of an input batch.
func AppendRecord(dst []byte, offset, timestamp int64, key, value []byte, headers []Header) []byte {
	dst = AppendRecordHead(dst, offset, timestamp, key, value, len(headers))
	for _, h := range headers {
		dst = AppendHeader(dst, h.Key, h.Value)
	}
	return dst
}

// AppendRecordHead appends a record of an input batch up to its header
// count; its nHeaders headers follow, each by AppendHeader (for a caller
// whose headers are of another type).
func AppendRecordHead(dst []byte, offset, timestamp int64, key, value []byte, nHeaders int) []byte {
	dst = appendU64(dst, uint64(offset))
	dst = appendU64(dst, uint64(timestamp))
	dst = appendNullable(dst, key)
	dst = appendNullable(dst, value)
	return appendU32(dst, uint32(nHeaders))
}

// AppendHeader appends one header (a nil value is null).
func AppendHeader(dst []byte, key string, value []byte) []byte {
	return appendNullable(appendString(dst, key), value)
}

func appendHeaders(dst []byte, hs []Header) []byte {
	dst = appendU32(dst, uint32(len(hs)))
	for _, h := range hs {
		dst = AppendHeader(dst, h.Key, h.Value)
	}
	return dst
}

// RecordSize is AppendRecord's length for a record with key, value and
// headers of these lengths: 28 + len(key) + len(value) + the headers' sizes
// (HeaderSize each).
func RecordSize(key, value []byte) int { return 28 + len(key) + len(value) }

// HeaderSize is one header's encoded length.
func HeaderSize(key string, value []byte) int { return 8 + len(key) + len(value) }

// EncodeBatch appends b's encoding to dst.
func EncodeBatch(dst []byte, b *Batch) []byte {
	dst = AppendBatchHeader(dst, b.Topic, b.Partition, len(b.Records))
	for i := range b.Records {
		r := &b.Records[i]
		dst = AppendRecord(dst, r.Offset, r.Timestamp, r.Key, r.Value, r.Headers)
	}
	return dst
}

// EncodeOutput appends the encoding of a module's results to dst (the
// guest side of ferry_on_*). An empty output (len 0, which EncodeOutput
// never makes) means every record unchanged.
func EncodeOutput(dst []byte, results []Result) []byte {
	dst = appendU32(dst, uint32(len(results)))
	for i := range results {
		r := &results[i]
		dst = append(dst, byte(r.Action))
		switch r.Action {
		case Replace:
			dst = appendNullable(dst, r.Key)
			dst = appendNullable(dst, r.Value)
			dst = appendHeaders(dst, r.Headers)
		case Reject:
			dst = appendString(dst, r.Reason)
		}
	}
	return dst
}

// EncodeConfig encodes a module's configuration (ferry_init's input):
// the entries sorted by key.
func EncodeConfig(config map[string]string) []byte {
	keys := make([]string, 0, len(config))
	n := 4
	for k, v := range config {
		keys = append(keys, k)
		n += 8 + len(k) + len(v)
	}
	sort.Strings(keys)
	dst := make([]byte, 0, n)
	dst = appendU32(dst, uint32(len(keys)))
	for _, k := range keys {
		dst = appendString(dst, k)
		dst = appendString(dst, config[k])
	}
	return dst
}

// --- decoding ---

// reader reads ABI data, recording the first error.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: at byte %d: %s", ErrMalformed, r.off, fmt.Sprintf(format, args...))
	}
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) u32(what string) uint32 {
	if r.err != nil {
		return 0
	}
	if r.left() < 4 {
		r.fail("%s: need 4 bytes, %d left", what, r.left())
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) u64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	if r.left() < 8 {
		r.fail("%s: need 8 bytes, %d left", what, r.left())
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

func (r *reader) u8(what string) byte {
	if r.err != nil {
		return 0
	}
	if r.left() < 1 {
		r.fail("%s: need 1 byte, none left", what)
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) bytes(n uint32, what string) []byte {
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(r.left()) {
		r.fail("%s: length %d past the end (%d bytes left)", what, n, r.left())
		return nil
	}
	v := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return v
}

// nullable reads an i32 length (-1: nil) and the bytes.
func (r *reader) nullable(what string) []byte {
	n := r.u32(what + " length")
	if r.err != nil {
		return nil
	}
	if n == math.MaxUint32 {
		return nil
	}
	if int32(n) < 0 {
		r.fail("%s: length %d", what, int32(n))
		return nil
	}
	return r.bytes(n, what)
}

func (r *reader) string(what string) string { return string(r.bytes(r.u32(what+" length"), what)) }

// count reads a u32 count of items each at least min bytes long, refusing
// counts the remaining bytes cannot hold (no allocation for a huge count).
func (r *reader) count(min int, what string) int {
	n := r.u32(what)
	if r.err != nil {
		return 0
	}
	if uint64(n)*uint64(min) > uint64(r.left()) {
		r.fail("%s %d: more than the %d bytes left can hold", what, n, r.left())
		return 0
	}
	return int(n)
}

func (r *reader) headers() []Header {
	n := r.count(8, "header count")
	if n == 0 {
		return nil
	}
	hs := make([]Header, n)
	for i := range hs {
		hs[i].Key = r.string("header name")
		hs[i].Value = r.nullable("header value")
		if r.err != nil {
			return nil
		}
	}
	return hs
}

func (r *reader) end() error {
	if r.err == nil && r.left() != 0 {
		r.fail("%d trailing bytes", r.left())
	}
	return r.err
}

// DecodeOutput decodes a module's output batch for an input of n records.
// It fails (wrapping ErrMalformed) unless out holds exactly n results with
// known actions and lengths within out. The results' slices alias out.
// (An empty output, "every record unchanged", is the caller's fast path:
// DecodeOutput refuses it as short.)
func DecodeOutput(out []byte, n int) ([]Result, error) {
	r := &reader{b: out}
	got := r.u32("record count")
	if r.err != nil {
		return nil, r.err
	}
	if uint64(got) != uint64(n) {
		r.fail("%d results for %d records", got, n)
		return nil, r.err
	}
	if uint64(got) > uint64(r.left()) { // one byte per result at least
		r.fail("%d results: more than the %d bytes left can hold", got, r.left())
		return nil, r.err
	}
	res := make([]Result, n)
	for i := range res {
		if err := r.result(&res[i]); err != nil {
			return nil, fmt.Errorf("result %d: %w", i, err)
		}
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	return res, nil
}

func (r *reader) result(res *Result) error {
	res.Action = Action(r.u8("action"))
	switch res.Action {
	case Keep, Skip:
	case Replace:
		res.Key = r.nullable("key")
		res.Value = r.nullable("value")
		res.Headers = r.headers()
	case Reject:
		res.Reason = r.string("reason")
	default:
		if r.err == nil {
			r.off--
			r.fail("unknown action %d", uint8(res.Action))
		}
	}
	return r.err
}

// DecodeBatch decodes an input batch (the guest side). The records'
// slices alias in.
func DecodeBatch(in []byte) (*Batch, error) {
	r := &reader{b: in}
	b := &Batch{Topic: r.string("topic")}
	b.Partition = int32(r.u32("partition"))
	n := r.count(28, "record count")
	if r.err != nil {
		return nil, r.err
	}
	b.Records = make([]Record, n)
	for i := range b.Records {
		rec := &b.Records[i]
		rec.Offset = int64(r.u64("offset"))
		rec.Timestamp = int64(r.u64("timestamp"))
		rec.Key = r.nullable("key")
		rec.Value = r.nullable("value")
		rec.Headers = r.headers()
		if r.err != nil {
			return nil, fmt.Errorf("record %d: %w", i, r.err)
		}
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	return b, nil
}

// DecodeConfig decodes ferry_init's input (the guest side).
func DecodeConfig(in []byte) (map[string]string, error) {
	r := &reader{b: in}
	n := r.count(8, "entry count")
	m := make(map[string]string, n)
	for i := 0; i < n && r.err == nil; i++ {
		k := r.string("key")
		m[k] = r.string("value")
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	return m, nil
}
