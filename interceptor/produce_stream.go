package interceptor

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// ValueStreamer is a produce interceptor that can take a record value as it
// arrives instead of whole (large-message). The proxy streams a value from
// the client's socket to the interceptor when the topic's produce chain is
// that interceptor alone (Chain.Streamer), the value is over
// StreamThreshold, its batch is uncompressed, and Offloads says the record
// must be offloaded. The record then reaches the chain with the reference
// StreamValue returned, and ProcessRecord finds it in the request's Streams
// (WithStreams) and defers the StreamedValue: committed with its batch,
// aborted (the object deleted) when the batch or the partition is refused,
// confirmed after the broker's acknowledgement, like any offload.
type ValueStreamer interface {
	ProduceRequestInterceptor
	// StreamThreshold is the value size in bytes above which a value is
	// worth streaming (large.message.stream.threshold.bytes).
	StreamThreshold() int64
	// Offloads reports whether a record of recordLen bytes (its
	// largemessage.RecordLen) in an uncompressed batch of a topic with
	// limits lim must be offloaded (ProcessRecord would offload it), and
	// its value can be published read once (the store does not need its
	// digest first).
	Offloads(lim TopicLimit, recordLen int64) bool
	// StallTimeout bounds the wait for the next bytes of a value being
	// streamed, from the client or into the store
	// (large.message.payload.store.timeout.ms).
	StallTimeout() time.Duration
	// StreamValue publishes the size bytes body yields, read once, as the
	// value of a record of topic: hashed (SHA-256 and CRC-32C) as it is
	// written. The object is complete and named by the returned reference
	// once StreamValue returns nil; on error nothing is left at its path.
	StreamValue(ctx context.Context, topic string, body io.Reader, size int64) (*StreamedValue, error)
}

// StreamedValue is a record value a ValueStreamer published as it arrived.
// It is the record's Deferred work: Commit has nothing left to do, Abort
// deletes the object, Confirm makes sure it is still in place after the
// broker's acknowledgement (it cannot be published again: its bytes are
// gone).
type StreamedValue struct {
	Topic string
	// Value is the record's new value (a PayloadReferenceValue).
	Value []byte
	// Headers are the headers to append after the record's own, whose
	// value-side Ferry headers (DropHeader) are left out.
	Headers []Header
	// Size, SHA256 and CRC32C describe the payload.
	Size   int64
	SHA256 [sha256.Size]byte
	CRC32C uint32

	// Err, when set, is why the store could not take the value
	// (FailedStream): the record fails its partition with it.
	Err error

	// DropHeader reports whether a header the client sent with the value
	// is replaced by Headers (a stale reference's headers).
	DropHeader func(key string) bool

	abort     func(ctx context.Context)
	confirm   func(ctx context.Context) (int, error)
	committed atomic.Bool
	aborted   atomic.Bool
}

// NewStreamedValue returns a StreamedValue whose Abort calls abort (once)
// and whose Confirm calls confirm; for ValueStreamer implementations.
func NewStreamedValue(abort func(context.Context), confirm func(context.Context) (int, error)) *StreamedValue {
	return &StreamedValue{abort: abort, confirm: confirm}
}

// FailedStream is the StreamedValue of a value the store could not take
// (err): its record carries a placeholder, found again by the chain, which
// fails the record's partition with err. Nothing is left to delete.
func FailedStream(topic string, err error) *StreamedValue {
	v := &StreamedValue{Topic: topic, Err: err,
		Value:   fmt.Appendf(nil, "ferry: value not stored (%d)", failedStreams.Add(1)),
		Headers: []Header{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}}
	v.committed.Store(true)
	v.aborted.Store(true)
	return v
}

var failedStreams atomic.Int64

// Commit implements Deferred: the object was published as the value arrived.
func (v *StreamedValue) Commit(context.Context, *Record) error {
	v.committed.Store(true)
	return nil
}

// Abort implements Deferred: the object is deleted (once), in
// payloadstore.Undo(ctx).
func (v *StreamedValue) Abort(ctx context.Context) {
	if v.aborted.CompareAndSwap(false, true) && v.abort != nil {
		v.abort(payloadstore.Undo(ctx))
	}
}

// Confirm implements Confirmer.
func (v *StreamedValue) Confirm(ctx context.Context) (int, error) {
	if v.confirm == nil {
		return 0, nil
	}
	return v.confirm(ctx)
}

// RecordHeaders returns the headers of the record that carries v: own (the
// client's) without those v replaces, then v's.
func (v *StreamedValue) RecordHeaders(own []Header) []Header {
	out := make([]Header, 0, len(own)+len(v.Headers))
	for _, h := range own {
		if v.DropHeader == nil || !v.DropHeader(h.Key) {
			out = append(out, h)
		}
	}
	return append(out, v.Headers...)
}

// Streams are the values of one Produce request published as they arrived
// (StreamedValue), found again by the interceptor when the chain processes
// the records that reference them.
type Streams struct {
	mu    sync.Mutex
	byRef map[string]*StreamedValue // by reference bytes (each names its own object)
	all   []*StreamedValue
}

// Add records v, published for a record of v.Topic.
func (s *Streams) Add(v *StreamedValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byRef == nil {
		s.byRef = map[string]*StreamedValue{}
	}
	s.byRef[string(v.Value)] = v
	s.all = append(s.all, v)
}

// Len is how many values were streamed.
func (s *Streams) Len() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all)
}

// Find returns the StreamedValue a record of topic with value value
// carries, nil if none.
func (s *Streams) Find(topic string, value []byte) *StreamedValue {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	v := s.byRef[string(value)]
	s.mu.Unlock()
	if v == nil || v.Topic != topic {
		return nil
	}
	return v
}

// AbortUncommitted deletes the objects of the values whose records the
// chain did not accept (their batch or partition was refused, the request
// did not decode, the chain never ran): nothing references them. It
// returns how many it deleted. Call it once the chain has run.
func (s *Streams) AbortUncommitted(ctx context.Context) int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	all := s.all
	s.mu.Unlock()
	n := 0
	for _, v := range all {
		if !v.committed.Load() {
			v.Abort(ctx)
			n++
		}
	}
	return n
}

// AbortAll deletes every value's object: the request will not be
// forwarded (the client went away, the frame was malformed).
func (s *Streams) AbortAll(ctx context.Context) {
	if s == nil {
		return
	}
	s.mu.Lock()
	all := s.all
	s.mu.Unlock()
	for _, v := range all {
		v.Abort(ctx)
	}
}

type streamsKey struct{}

// WithStreams returns ctx carrying s, for the chain's ProcessRecord calls.
func WithStreams(ctx context.Context, s *Streams) context.Context {
	return context.WithValue(ctx, streamsKey{}, s)
}

// StreamsFrom returns the Streams ctx carries, nil if none.
func StreamsFrom(ctx context.Context) *Streams {
	s, _ := ctx.Value(streamsKey{}).(*Streams)
	return s
}

// CanStream reports whether any produce interceptor is a ValueStreamer: if
// none is, no value can be taken as a stream and a Produce frame is read
// whole, however large (proxy/producestream.go parses frames as they arrive
// only for such a chain).
func (c *Chain) CanStream() bool {
	for _, ic := range c.produce {
		if _, ok := ic.(ValueStreamer); ok {
			return true
		}
	}
	return false
}

// Streamer returns the interceptor that may take topic's values as streams:
// the only produce interceptor whose pattern matches topic, when it is a
// ValueStreamer; nil otherwise (another interceptor would read the values,
// so they are read whole).
func (c *Chain) Streamer(topic string) ValueStreamer {
	var only ProduceRequestInterceptor
	for _, ic := range c.produce {
		if ic.TopicPattern().MatchString(topic) {
			if only != nil {
				return nil
			}
			only = ic
		}
	}
	vs, _ := only.(ValueStreamer)
	return vs
}
