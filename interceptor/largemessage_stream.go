package interceptor

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// The produce side of large-message as a ValueStreamer: a value over
// large.message.stream.threshold.bytes goes from the client's socket to
// the store as it arrives (docs/PROXY.md "Large values as streams").

// StreamThreshold implements ValueStreamer
// (large.message.stream.threshold.bytes).
func (l *LargeMessage) StreamThreshold() int64 {
	if l.stream <= 0 {
		return DefaultStreamThreshold
	}
	return l.stream
}

// StallTimeout implements ValueStreamer
// (large.message.payload.store.timeout.ms).
func (l *LargeMessage) StallTimeout() time.Duration {
	if l.stall <= 0 {
		return payloadstore.DefaultPolicy.Timeout
	}
	return l.stall
}

// Offloads implements ValueStreamer: ProcessRecord's decision for a record
// of an uncompressed batch, made on its length (exact: the size of an
// uncompressed record does not depend on its bytes), and a store that can
// publish a value read once.
func (l *LargeMessage) Offloads(lim TopicLimit, recordLen int64) bool {
	if l.store == nil || !payloadstore.OnePass(l.store, payloadstore.Payload{Unhashed: true, ReadOnce: true}) {
		return false
	}
	lm := largemessage.DeriveLimits(l.threshold, int64(lim.MaxMessageBytes), 0)
	lm.TopicCompression = lim.Compression
	fits, decided := largemessage.Codec{Type: "none"}.FitsLen(lm, recordLen)
	return decided && !fits
}

// StreamValue implements ValueStreamer: the value is published with the
// serializer's OffloadValue (the same reference and headers as
// ProcessRecord's offload), plus ferry.payload.crc32c, computed on the way.
func (l *LargeMessage) StreamValue(ctx context.Context, topic string, body io.Reader, size int64) (*StreamedValue, error) {
	crc := crc32.New(castagnoli)
	rec := &kgo.Record{Topic: topic}
	did, err := l.sers["none"].OffloadValue(ctx, rec, payloadstore.OncePayload(io.TeeReader(body, crc), size))
	if err != nil {
		return nil, storeErr(err)
	}
	ref, err := largemessage.DecodeReference(rec.Value)
	if err != nil {
		return nil, err
	}
	path := ref.FullPayloadPath
	want := &payloadstore.Digest{Size: size, SHA256: did.ValueSHA256}
	v := NewStreamedValue(
		func(ctx context.Context) {
			if err := l.store.Delete(ctx, path); err != nil {
				payloadstore.UndoFailed(ctx)
			}
		},
		func(ctx context.Context) (int, error) {
			c, err := payloadstore.Confirm(ctx, l.store, path, want, nil)
			if err != nil {
				return 0, fmt.Errorf("topic %s: the record was acknowledged but its payload %s is gone: %w", topic, path, err)
			}
			if c != payloadstore.Present {
				return 1, nil
			}
			return 0, nil
		})
	v.Topic, v.Value, v.Size, v.SHA256, v.CRC32C = topic, rec.Value, size, did.ValueSHA256, crc.Sum32()
	v.Headers = make([]Header, 0, len(rec.Headers)+1)
	for _, h := range rec.Headers {
		if h.Key != largemessage.HeaderPayloadCRC32C { // (should the serializer write it one day)
			v.Headers = append(v.Headers, h)
		}
	}
	v.Headers = append(v.Headers, Header{Key: largemessage.HeaderPayloadCRC32C, Value: fmt.Appendf(nil, "%08x", v.CRC32C)})
	v.DropHeader = func(key string) bool {
		switch key {
		case largemessage.HeaderLargeMessage, largemessage.HeaderPayloadSize, largemessage.HeaderPayloadSHA256,
			largemessage.HeaderPayloadMetadata, largemessage.HeaderPayloadCRC32C:
			return true
		}
		return false
	}
	return v, nil
}

// streamed returns the StreamedValue r carries (its value was published as
// it arrived), nil if none.
func (l *LargeMessage) streamed(ctx context.Context, r *Record) (*StreamedValue, error) {
	s := StreamsFrom(ctx) // (set only for a request with streamed values)
	if s == nil || !referenced(r.Headers) {
		return nil, nil
	}
	v := s.Find(r.Topic, r.Value)
	if v == nil {
		return nil, nil
	}
	if v.Err != nil {
		return nil, v.Err
	}
	if marks := (kgo.Record{Headers: r.Headers}); largemessage.IsKeyOffloaded(&marks) {
		// The key's reference would need the checks a produced reference
		// gets (Adopt), which streamed records skip. (A key the client
		// sent inline is offloaded by ProcessRecord when it must be.)
		return nil, fmt.Errorf("%w: topic %s partition %s record %d: a record whose value is streamed (over %s) cannot carry a key reference (header %s)",
			kerr.InvalidRecord, r.Topic, strconv.Itoa(int(r.Partition)), r.Offset, KeyStreamThreshold, largemessage.HeaderLargeMessageKey)
	}
	return v, nil
}
