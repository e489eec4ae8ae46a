package largemessage

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrRecordTooLarge: even with key and value offloaded the record does not
// fit the limits (its headers alone are too large). Nothing was produced.
var ErrRecordTooLarge = errors.New("record does not fit max.message.bytes even with key and value offloaded")

// Serializer is KIP-1159's large-message Serializer over franz-go records.
// It is safe for concurrent use.
type Serializer struct {
	store payloadstore.PayloadStore
	codec Codec
	// noKey / noValue: the key.serializers / value.serializers chain has
	// no large-message stage, so that side is never offloaded.
	noKey, noValue bool
}

// NewSerializer returns a Serializer that publishes to store (normally one
// from Config.OpenStore, i.e. wrapped with the retry policy) and measures
// sizes with codec. store may be nil: records that fit pass, the others fail
// with ErrNoPayloadStore.
func NewSerializer(store payloadstore.PayloadStore, codec Codec) *Serializer {
	return &Serializer{store: store, codec: codec}
}

// Store returns the serializer's payload store.
func (s *Serializer) Store() payloadstore.PayloadStore { return s.store }

// Offloaded says what Offload did to a record.
type Offloaded struct {
	Key, Value bool
	// StoredBytes is the number of payload bytes published to the store.
	StoredBytes int64
}

// Offload makes rec fit l. A record that fits (Codec.Fits) is left exactly
// as it is: no copy, no header. Otherwise its value, then if needed its key,
// is published to the store and replaced by a PayloadReferenceValue, with the
// headers of docs/FORMAT.md appended. The larger side goes first. A nil value
// (a tombstone) is never offloaded; a key is offloaded under its content id,
// so equal keys keep equal bytes in Kafka (partitioning, compaction).
//
// A record that already carries a large-message header is passed through
// unchanged (it already holds references, e.g. when mirrored).
//
// Errors: a store failure (an *payloadstore.Error, after the policy's
// retries), ErrRecordTooLarge, or ctx's error. On error rec may have its
// value replaced but must not be produced; objects already published stay
// in the store until its TTL or `ferry gc` removes them (KIP-1159, "Partial
// Failure Handling").
func (s *Serializer) Offload(ctx context.Context, rec *kgo.Record, l Limits) (Offloaded, error) {
	var did Offloaded
	if IsOffloaded(rec) || IsKeyOffloaded(rec) {
		return did, nil
	}
	for range 2 {
		fits, err := s.codec.Fits(l, rec.Key, rec.Value, rec.Headers)
		if err != nil || fits {
			return did, err
		}
		valueFirst := len(rec.Value) >= len(rec.Key)
		switch {
		case !did.Value && !s.noValue && rec.Value != nil && (valueFirst || did.Key || s.noKey || rec.Key == nil):
			err = s.offloadSide(ctx, rec, valueSide, payloadstore.BytesPayload(rec.Value), &did)
		case !did.Key && !s.noKey && rec.Key != nil:
			p := payloadstore.BytesPayload(rec.Key)
			p.ID = p.HexSHA256()
			err = s.offloadSide(ctx, rec, keySide, p, &did)
		default:
			return did, fmt.Errorf("topic %s: %w (record %d bytes, threshold %d)", rec.Topic, ErrRecordTooLarge,
				RecordLen(rec.Key, rec.Value, rec.Headers), l.Threshold)
		}
		if err != nil {
			return did, err
		}
	}
	if fits, err := s.codec.Fits(l, rec.Key, rec.Value, rec.Headers); err != nil || !fits {
		if err == nil {
			err = fmt.Errorf("topic %s: %w (record %d bytes, threshold %d)", rec.Topic, ErrRecordTooLarge,
				RecordLen(rec.Key, rec.Value, rec.Headers), l.Threshold)
		}
		return did, err
	}
	return did, nil
}

// OffloadValue publishes p as rec's value whatever its size and sets rec's
// value and headers to the reference. It is the streaming form of Offload
// for payloads that are not in memory (a file, a spooled stdin).
func (s *Serializer) OffloadValue(ctx context.Context, rec *kgo.Record, p payloadstore.Payload) (Offloaded, error) {
	var did Offloaded
	err := s.offloadSide(ctx, rec, valueSide, p, &did)
	return did, err
}

// ErrNoPayloadStore: a record must be offloaded but no payload store is
// configured (large.message.payload.store.url).
var ErrNoPayloadStore = errors.New("no payload store is configured (large.message.payload.store.url)")

func (s *Serializer) offloadSide(ctx context.Context, rec *kgo.Record, sd side, p payloadstore.Payload, did *Offloaded) error {
	if s.store == nil {
		return fmt.Errorf("topic %s: the %s (%d bytes) must be offloaded: %w", rec.Topic, sd.name, p.Size, ErrNoPayloadStore)
	}
	resp, err := s.store.Publish(ctx, rec.Topic, p)
	if err != nil {
		return fmt.Errorf("topic %s: offloading the %s (%d bytes): %w", rec.Topic, sd.name, p.Size, err)
	}
	ref, err := PayloadReferenceValue{FullPayloadPath: resp.FullPayloadPath, PayloadStoreClass: s.store.Class()}.AppendTo(nil)
	if err != nil {
		return fmt.Errorf("topic %s: %w", rec.Topic, err)
	}
	// A copy: the caller may share one header slice between records.
	rec.Headers = append(withoutSide(slices.Clone(rec.Headers), sd), sideHeaders(sd, p.Size, p.SHA256, resp.CustomMetadata)...)
	if sd.name == "key" {
		rec.Key = ref
		did.Key = true
	} else {
		rec.Value = ref
		did.Value = true
	}
	did.StoredBytes += p.Size
	return nil
}
