package largemessage

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
	// copyTopics: large.message.reference.copy.topics (nil: none).
	copyTopics *regexp.Regexp
}

// NewSerializer returns a Serializer that publishes to store (normally one
// from Config.OpenStore, i.e. wrapped with the retry policy) and measures
// sizes with codec. store may be nil: records that fit pass, the others fail
// with ErrNoPayloadStore.
//
// References into other topics are copied from any topic (the library's
// default of large.message.reference.copy.topics); WithCopyTopics changes
// that.
func NewSerializer(store payloadstore.PayloadStore, codec Codec) *Serializer {
	return &Serializer{store: store, codec: codec, copyTopics: DefaultConfig().CopyTopics}
}

// WithCopyTopics sets large.message.reference.copy.topics (nil: a
// reference into another topic is refused) and returns s.
func (s *Serializer) WithCopyTopics(re *regexp.Regexp) *Serializer {
	s.copyTopics = re
	return s
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
// A record that arrives already carrying Ferry's headers (re-produced from a
// consumed record: a dead-letter or retry topic, a mirror) is adopted first
// (see Adopt): a side whose bytes are not a reference loses the stale headers
// and is sized as a plain value; a reference is re-bound to rec's topic.
//
// Errors: a store failure (an *payloadstore.Error, after the policy's
// retries), ErrRecordTooLarge, Adopt's errors, or ctx's error. On error rec
// may have its value replaced but must not be produced; objects already
// published stay in the store until its TTL or `ferry gc` removes them
// (KIP-1159, "Partial Failure Handling").
func (s *Serializer) Offload(ctx context.Context, rec *kgo.Record, l Limits) (Offloaded, error) {
	var did Offloaded
	keyRef, valueRef, err := s.Adopt(ctx, rec)
	if err != nil {
		return did, err
	}
	for range 2 {
		fits, err := s.codec.Fits(l, rec.Key, rec.Value, rec.Headers)
		if err != nil || fits {
			return did, err
		}
		canValue := !valueRef && !did.Value && !s.noValue && rec.Value != nil
		canKey := !keyRef && !did.Key && !s.noKey && rec.Key != nil
		switch {
		case canValue && (len(rec.Value) >= len(rec.Key) || !canKey):
			err = s.offloadSide(ctx, rec, valueSide, payloadstore.BytesPayload(rec.Value), &did)
		case canKey:
			p := payloadstore.BytesPayload(rec.Key)
			p.ID = p.HexSHA256()
			err = s.offloadSide(ctx, rec, keySide, p, &did)
		default:
			return did, s.tooLarge(rec, l)
		}
		if err != nil {
			return did, err
		}
	}
	if fits, err := s.codec.Fits(l, rec.Key, rec.Value, rec.Headers); err != nil || !fits {
		if err == nil {
			err = s.tooLarge(rec, l)
		}
		return did, err
	}
	return did, nil
}

// tooLarge is ErrRecordTooLarge for rec, naming the topic and the limits.
func (s *Serializer) tooLarge(rec *kgo.Record, l Limits) error {
	return fmt.Errorf("topic %s: %w (record %d bytes with %d header bytes; threshold %d, %s)", rec.Topic, ErrRecordTooLarge,
		RecordLen(rec.Key, rec.Value, rec.Headers), headerBytes(rec.Headers), l.Threshold, l.describe())
}

func headerBytes(hs []kgo.RecordHeader) int {
	n := 0
	for _, h := range hs {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Adopt takes in a record that carries Ferry's headers already, before it is
// produced again, and reports which sides hold references afterwards:
//
//   - a side marked as offloaded whose bytes are not a PayloadReferenceValue
//     (the payload itself, with stale headers kept by a dead-letter
//     pattern) loses Ferry's headers of that side and is a plain value;
//   - a reference into this store's objects of rec's own topic is kept and
//     the object touched (its age, which ferry gc counts, starts again);
//   - a reference into another topic's object is copied into rec's topic
//     when that topic matches large.message.reference.copy.topics, and the
//     reference rewritten to the copy; otherwise it fails with
//     payloadstore.ErrWrongTopic;
//   - a reference into another store fails with payloadstore.ErrInvalidPath.
//
// rec's headers are copied before they change (they may be shared).
func (s *Serializer) Adopt(ctx context.Context, rec *kgo.Record) (keyRef, valueRef bool, err error) {
	for _, sd := range []side{keySide, valueSide} {
		if !marked(rec.Headers, sd.marker) {
			continue
		}
		b := &rec.Value
		if sd.name == "key" {
			b = &rec.Key
		}
		ref, derr := DecodeReference(*b)
		if derr != nil {
			rec.Headers = withoutSide(slices.Clone(rec.Headers), sd)
			continue
		}
		path, err := s.rebind(ctx, rec.Topic, ref.FullPayloadPath)
		if err != nil {
			return false, false, fmt.Errorf("topic %s: the record's %s is a reference: %w", rec.Topic, sd.name, err)
		}
		if path != ref.FullPayloadPath {
			ref.FullPayloadPath = path
			if *b, err = ref.AppendTo(nil); err != nil {
				return false, false, fmt.Errorf("topic %s: %w", rec.Topic, err)
			}
		}
		if sd.name == "key" {
			keyRef = true
		} else {
			valueRef = true
		}
	}
	return keyRef, valueRef, nil
}

// rebind applies Adopt's rules to one reference and returns the path the
// record should carry.
func (s *Serializer) rebind(ctx context.Context, topic, path string) (string, error) {
	if s.store == nil {
		return "", ErrNoPayloadStore
	}
	kp, err := payloadstore.PathKey(path)
	if err != nil {
		return "", err
	}
	if kp.Topic != topic && (s.copyTopics == nil || !s.copyTopics.MatchString(kp.Topic)) {
		return "", fmt.Errorf("%w: %s (%s allows copying from other topics)", payloadstore.ErrWrongTopic, kp.Topic, KeyReferenceCopyTopics)
	}
	return payloadstore.CopyToTopic(ctx, s.store, path, topic)
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

// offloadAll offloads rec's value (then its key, if the record still does
// not fit l) whatever their size: the recovery of a record the broker
// refused as too large.
func (s *Serializer) offloadAll(ctx context.Context, rec *kgo.Record, l Limits) error {
	keyRef, valueRef, err := s.Adopt(ctx, rec)
	if err != nil {
		return err
	}
	var did Offloaded
	if !valueRef && !s.noValue && rec.Value != nil {
		if err := s.offloadSide(ctx, rec, valueSide, payloadstore.BytesPayload(rec.Value), &did); err != nil {
			return err
		}
	}
	if fits, err := s.codec.Fits(l, rec.Key, rec.Value, rec.Headers); err != nil || fits {
		return err
	}
	if !keyRef && !s.noKey && rec.Key != nil {
		p := payloadstore.BytesPayload(rec.Key)
		p.ID = p.HexSHA256()
		return s.offloadSide(ctx, rec, keySide, p, &did)
	}
	return s.tooLarge(rec, l)
}
