// Package interceptor runs KIP-905 broker interceptors over Kafka produce
// requests and fetch responses, for Ferry's protocol proxy.
//
// An interceptor sees one record at a time (topic, partition, key, value,
// headers, timestamp) and keeps it (possibly with a new key, value or
// headers), skips it (ErrSkipRecord) or fails it (any other error). A Chain
// runs the configured interceptors in order over the record batches of the
// topics they match, rewrites those batches with Kafka's guarantees kept
// (CRC-32C, lengths, offset deltas, producer id/epoch/sequence, same codec)
// and checks the exact size of every rewritten produce batch against the
// topic's max.message.bytes (KIP-126). See docs/INTERCEPTORS.md.
package interceptor

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrSkipRecord, returned by an interceptor (possibly wrapped), drops the
// record (KIP-905's ProduceRequestInterceptorSkipRecordException). On
// produce it is honoured only in batches without a producer id: a skip in
// an idempotent or transactional batch would break its sequence numbers, so
// that partition is rejected with INVALID_RECORD instead.
var ErrSkipRecord = errors.New("skip record")

// Header is a record header (Kafka's Header: a string key, a byte value).
type Header = kgo.RecordHeader

// Record is what one interceptor call sees. Key, Value and Headers may be
// replaced or changed; the other fields are information and changes to them
// are ignored. A nil Key or Value is Kafka's null.
//
// Key, Value and the headers' values (and names: strings over the same
// bytes) are views over the batch's bytes (the request's or response's,
// or the batch's decompressed records): never write into them, assign new
// slices; and keep none after the call returns without copying it
// (the decompressed records' buffer serves the next batch), except in
// Deferred work, whose batch keeps its buffers. Headers is the record's own
// copy, which may be changed in place (in an interceptor call it has
// room for one more header: appending one allocates nothing). The chain compares the record after
// the call with what it read: a batch whose records all stay as they came
// goes out as its bytes, and a field left as it is costs nothing.
type Record struct {
	Topic     string
	Partition int32
	Key       []byte
	Value     []byte
	Headers   []Header
	// Timestamp is the record's timestamp in ms since the epoch
	// (CreateTime, or LogAppendTime on fetch when the batch says so).
	Timestamp int64
	// Offset is the record's offset on fetch; on produce the broker has
	// not assigned one yet and Offset is the record's index in its batch.
	Offset int64
	// Batch describes the record batch the record came in.
	Batch BatchInfo
	// Aborted: on fetch, the record belongs to a transaction the response
	// lists as aborted. read_committed consumers drop it, but a client can
	// ignore the list, so an interceptor that protects data must process
	// it too; one that only serves consumers (large-message) may leave it
	// as it is. An error on such a record drops it.
	Aborted bool

	deferred []namedDeferred // work to do once the batch is accepted (produce)
	led      *ledger         // the worker's memory ledger (Reserve)
	// canStream: on fetch, the value may be left as a hole (stream.go):
	// no interceptor after this one reads it.
	canStream bool
	stream    *valueStream  // the value is this stream (Value is empty)
	batch     *decodedBatch // the batch r was filled from (buffer), nil otherwise
	index     int           // r's index in batch
}

// Deferred is work an interceptor prepared for a record that must wait
// until the record's whole batch is known to be accepted by the chain:
// large-message's publishing of a payload, so that a batch refused (too
// large, another record failing) leaves nothing in the store. The record
// already holds its final form (large-message: references to the objects
// Commit will write).
type Deferred interface {
	// Commit does the work. It may change r's key, value or headers (a
	// store's custom metadata); the chain then measures the batch again.
	// On error, Commit has undone its own partial work.
	Commit(ctx context.Context, r *Record) error
	// Abort undoes Commit (deletes what it wrote, where no other record
	// can share it). It is called when a later step fails, when the
	// broker refuses the batch for good, and also after a Commit whose
	// call the chain counts as failed although Commit returned nil (its
	// context ended meanwhile): Abort must be safe after any Commit, and
	// more than once, and must not depend on ctx being live. Undo in
	// payloadstore.Undo(ctx): ctx's values without its cancellation, ended
	// by the proxy's Shutdown deadline (payloadstore.UndoBound).
	Abort(ctx context.Context)
}

// Defer registers d to be committed once the record's batch is accepted
// (produce only; on fetch d is committed at once).
func (r *Record) Defer(d Deferred) { r.deferred = append(r.deferred, namedDeferred{d: d}) }

// namedDeferred is a Deferred with the name of the interceptor that made it.
type namedDeferred struct {
	name string
	d    Deferred
}

// Reserve takes n bytes from the proxy's memory budget
// (proxy.memory.max.bytes) for data the interceptor is about to hold for
// this record, such as a payload it downloads; they are given back when
// the batch is done. It waits while the budget is full, until ctx ends.
// Errors wrap ErrMemoryBusy.
func (r *Record) Reserve(ctx context.Context, n int64) error { return r.led.charge(ctx, n) }

// BatchInfo describes a record batch, for interceptors whose decisions
// depend on it (large-message measures sizes with the batch's codec).
type BatchInfo struct {
	// Compression is the batch's codec: "none", "gzip", "snappy", "lz4" or
	// "zstd"; a rewritten batch is recompressed with the same codec.
	Compression string
	// ProducerID is -1 for a batch without idempotence.
	ProducerID    int64
	ProducerEpoch int16
	Transactional bool
	// MaxMessageBytes is the topic's max.message.bytes on produce (0 when
	// unknown, and always 0 on fetch).
	MaxMessageBytes int32
	// TopicCompression is the topic's compression.type on produce ("" when
	// unknown): the broker re-encodes batches of another codec.
	TopicCompression string
}

// ProduceRequestInterceptor processes records of produce requests before
// they reach the broker (KIP-905).
type ProduceRequestInterceptor interface {
	// Name is the interceptor's name, used in error messages.
	Name() string
	// TopicPattern selects the topics the interceptor runs on (KIP-905's
	// interceptorTopicPattern); it must match the whole topic name, as a
	// Java Pattern's matches() does (see CompileTopicPattern).
	TopicPattern() *regexp.Regexp
	// ProcessRecord changes r in place and returns nil, or returns
	// ErrSkipRecord to drop it, or another error to fail the record's
	// partition. A *kerr.Error in the chain (errors.As) sets the error code
	// the producer gets; the default is INVALID_RECORD. ctx is cancelled
	// when the call runs over the chain's time budget: an interceptor must
	// return promptly then (its result is discarded either way).
	ProcessRecord(ctx context.Context, r *Record) error
}

// FetchResponseInterceptor processes records of fetch responses before the
// consumer sees them (KIP-905's consume-time interceptor). Its contract is
// ProduceRequestInterceptor's, except that a skip is always honoured (the
// record is left out; offsets of the others are kept) and an error fails the
// partition of that fetch (see Chain.InterceptFetch).
type FetchResponseInterceptor interface {
	Name() string
	TopicPattern() *regexp.Regexp
	ProcessRecord(ctx context.Context, r *Record) error
}

// BatchShrinker is implemented by a ProduceRequestInterceptor that can make
// a record smaller at any size (large-message offloads its value). When a
// rewritten batch is over max.message.bytes, the chain calls Shrink on the
// records that gain most, largest first, until the batch fits or no record
// shrinks; a shrink that does not make its record smaller (the added
// headers outweigh the value) is undone. Shrink must defer its I/O
// (Record.Defer): nothing is committed unless the batch then fits.
type BatchShrinker interface {
	// Shrink makes r smaller and reports whether it did.
	Shrink(ctx context.Context, r *Record) (bool, error)
}

// FetchSizer is implemented by a FetchResponseInterceptor whose records
// grow (large-message puts payloads back): GrowsBy says by how many bytes r
// will grow, without I/O, so that the chain keeps a fetch response within
// the consumer's limits before anything is read (KIP-74). ok false: not
// known in advance (the record is processed, then measured).
type FetchSizer interface {
	GrowsBy(r *Record) (n int64, ok bool)
}

// Skimmer is implemented by an interceptor (produce or fetch side) that
// acts on few records and can tell which from a record's wire form alone:
// its length and its header names. When every interceptor matching a
// topic is a Skimmer, the proxy reads that topic's record sets in place
// (Chain.ProduceUntouched, Chain.FetchUntouched) and passes a request or
// response none of whose records any of them may act on as its bytes: no
// record decoded, no interceptor called, no goroutine or timer, nothing
// encoded. Records of compressed batches are not skimmed: the chain sees
// them. An interceptor that decides from the records' contents (encrypt,
// redact, validate-*, wasm) is not a Skimmer and sees every record.
//
// large-message is one: on produce it acts on records longer than its
// threshold and on those carrying a reference (header large-message or
// large-message-key, verified); on fetch on those carrying a reference.
type Skimmer interface {
	// Skim says which records of an uncompressed batch described by
	// info the interceptor may act on (on produce info carries the
	// topic's max.message.bytes and compression.type; on fetch they are
	// unknown). ok false: any of them (the batch goes through the chain).
	Skim(info BatchInfo) (s Skim, ok bool)
}

// Skim is what a Skimmer may act on in an uncompressed batch: a record
// whose length in the batch's records section, its length varint
// included, is over MaxRecordBytes, or that carries a header named in
// Headers (whatever its value).
type Skim struct {
	// MaxRecordBytes in bytes; -1: no record is acted on for its size.
	MaxRecordBytes int64
	Headers        []string
}

// Instance is what a Factory builds: a produce-time interceptor, a
// fetch-time one, or both (either may be nil), and what to release.
type Instance struct {
	Produce ProduceRequestInterceptor
	Fetch   FetchResponseInterceptor
	// Close releases the instance's resources; nil if none.
	Close func() error
}

// Factory builds an interceptor from its configuration: Kafka-style keys
// and string values, as the proxy reads them from its YAML file (koanf) or
// flags. Errors name the key and the value at fault.
type Factory func(ctx context.Context, config map[string]string) (Instance, error)

var (
	regMu    sync.RWMutex
	registry = map[string]Factory{}
)

// Register makes a factory available by name (the name used in the proxy's
// configuration). It panics if the name is taken or f is nil, as it is meant
// for init functions.
func Register(name string, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	if f == nil || name == "" {
		panic("interceptor: Register with an empty name or a nil factory")
	}
	if _, ok := registry[name]; ok {
		panic("interceptor: " + name + " is registered twice")
	}
	registry[name] = f
}

// Names lists the registered interceptors, sorted.
func Names() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// New builds the interceptor registered as name with config. A key its
// configuration may not hold (RegisterKeys) is an error naming it.
func New(ctx context.Context, name string, config map[string]string) (Instance, error) {
	regMu.RLock()
	f, ok := registry[name]
	keyErr := checkKeys(name, config)
	regMu.RUnlock()
	if !ok {
		return Instance{}, fmt.Errorf("interceptor %q is not registered (known: %v)", name, Names())
	}
	if keyErr != nil {
		return Instance{}, fmt.Errorf("interceptor %s: %w", name, keyErr)
	}
	in, err := f(ctx, config)
	if err != nil {
		return Instance{}, fmt.Errorf("interceptor %s: %w", name, err)
	}
	return in, nil
}

// KeyTopicPattern is the configuration key of every built-in's topic
// pattern (a Go regexp matching whole topic names; default ".*").
const KeyTopicPattern = "topic.pattern"

// CompileTopicPattern compiles a KIP-905 topic pattern so that it matches
// whole topic names only ("orders" does not match "orders-dlq").
func CompileTopicPattern(p string) (*regexp.Regexp, error) {
	if p == "" {
		p = ".*"
	}
	re, err := regexp.Compile(`^(?:` + p + `)$`)
	if err != nil {
		return nil, fmt.Errorf("%s: %q is not a regular expression: %w", KeyTopicPattern, p, err)
	}
	return re, nil
}
