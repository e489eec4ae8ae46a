package interceptor

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func init() { Register("large-message", newLargeMessageFromConfig) }

// LargeMessage is the large-message interceptor (KIP-1159 in the proxy). On
// produce it offloads every record that would not fit inline to the payload
// store, in the Go library's wire format (large-message header,
// PayloadReferenceValue, ferry.payload.size / ferry.payload.sha256 headers),
// and, as a BatchShrinker, offloads more values when the rewritten batch is
// still over the topic's max.message.bytes. On fetch it replaces references
// by their payloads and removes Ferry's headers, whether the proxy or the
// Go library offloaded them.
type LargeMessage struct {
	pattern   *regexp.Regexp
	threshold int64 // large.message.threshold.bytes; 0 derives it
	sers      map[string]*largemessage.Serializer
	de        *largemessage.Deserializer
	store     payloadstore.PayloadStore
}

// NewLargeMessage returns the interceptor over store (normally from
// largemessage.Config.OpenStore) with cfg's threshold and
// skip-not-found setting, for topics matching pattern.
func NewLargeMessage(store payloadstore.PayloadStore, cfg largemessage.Config, pattern *regexp.Regexp) *LargeMessage {
	l := &LargeMessage{pattern: pattern, threshold: cfg.Threshold, store: store,
		sers: map[string]*largemessage.Serializer{},
		de:   largemessage.NewDeserializer(store, cfg.SkipNotFound)}
	for _, c := range codecNames {
		l.sers[c] = largemessage.NewSerializer(store, largemessage.Codec{Type: c})
	}
	return l
}

// newLargeMessageFromConfig reads topic.pattern, side (default both) and
// the large.message.* keys (largemessage.ParseConfig; the store URL
// large.message.payload.store.url is required) and opens the store.
func newLargeMessageFromConfig(ctx context.Context, config map[string]string) (Instance, error) {
	cfg, err := largemessage.ParseConfig(config)
	if err != nil {
		return Instance{}, err
	}
	re, err := CompileTopicPattern(config[KeyTopicPattern])
	if err != nil {
		return Instance{}, err
	}
	p, f, err := sides(config, "both")
	if err != nil {
		return Instance{}, err
	}
	store, err := cfg.OpenStore(ctx)
	if err != nil {
		return Instance{}, err
	}
	l := NewLargeMessage(store, cfg, re)
	in := Instance{Close: store.Close}
	if p {
		in.Produce = l
	}
	if f {
		in.Fetch = fetchSide{l}
	}
	return in, nil
}

func (l *LargeMessage) Name() string                 { return "large-message" }
func (l *LargeMessage) TopicPattern() *regexp.Regexp { return l.pattern }

// limits are the record limits for r's batch: the configured threshold (or
// the derived one), capped so a record offloaded or not fits
// max.message.bytes with the batch overhead.
func (l *LargeMessage) limits(r *Record) largemessage.Limits {
	return largemessage.DeriveLimits(l.threshold, int64(r.Batch.MaxMessageBytes), 0)
}

func toKgo(r *Record) kgo.Record {
	return kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

// storeErr maps a large-message error to the code the client gets: a
// record too large even offloaded is MESSAGE_TOO_LARGE; a store failure
// KAFKA_STORAGE_ERROR (retriable: nothing was appended).
func storeErr(err error) error {
	var se *payloadstore.Error
	switch {
	case errors.Is(err, largemessage.ErrRecordTooLarge):
		return fmt.Errorf("%w: %w", kerr.MessageTooLarge, err)
	case errors.As(err, &se), errors.Is(err, largemessage.ErrNoPayloadStore):
		return fmt.Errorf("%w: %w", kerr.KafkaStorageError, err)
	}
	return err
}

// ProcessRecord offloads r's value (then key) when the record does not fit
// the threshold, measured exactly with the batch's codec.
func (l *LargeMessage) ProcessRecord(ctx context.Context, r *Record) error {
	kr := toKgo(r)
	if err := checkReferences(&kr); err != nil {
		return err
	}
	codec := r.Batch.Compression
	ser := l.sers[codec]
	if ser == nil {
		ser = l.sers["none"]
	}
	did, err := ser.Offload(ctx, &kr, l.limits(r))
	if err != nil {
		return storeErr(err)
	}
	if did.Key || did.Value {
		r.Key, r.Value, r.Headers = kr.Key, kr.Value, kr.Headers
	}
	return nil
}

// Shrink offloads r's value whatever its size (BatchShrinker), unless it is
// null or already a reference.
func (l *LargeMessage) Shrink(ctx context.Context, r *Record) (bool, error) {
	kr := toKgo(r)
	if kr.Value == nil || largemessage.IsOffloaded(&kr) {
		return false, nil
	}
	if _, err := l.sers["none"].OffloadValue(ctx, &kr, payloadstore.BytesPayload(kr.Value)); err != nil {
		return false, storeErr(err)
	}
	r.Value, r.Headers = kr.Value, kr.Headers
	return true, nil
}

// fetchSide is the fetch-time half.
type fetchSide struct{ l *LargeMessage }

func (f fetchSide) Name() string                 { return "large-message" }
func (f fetchSide) TopicPattern() *regexp.Regexp { return f.l.pattern }

// ProcessRecord resolves r's references (largemessage.Deserializer.Resolve).
// With large.message.skip.not.found.error a missing payload leaves a null
// value and the record passes; other errors (store down, corrupt reference,
// digest mismatch) fail the partition's fetch with KAFKA_STORAGE_ERROR.
func (f fetchSide) ProcessRecord(ctx context.Context, r *Record) error {
	kr := toKgo(r)
	if !largemessage.IsOffloaded(&kr) && !largemessage.IsKeyOffloaded(&kr) {
		return nil
	}
	kr.Offset = r.Offset
	err := f.l.de.Resolve(ctx, &kr)
	var re *largemessage.RecordError
	if err != nil && !(errors.As(err, &re) && re.Skipped) {
		return err
	}
	r.Key, r.Value, r.Headers = kr.Key, kr.Value, kr.Headers
	return nil
}

// checkReferences refuses a record that arrives marked large-message (or
// large-message-key) but whose value (or key) is not a PayloadReferenceValue:
// appended, it would stop every consumer reading through the proxy at that
// offset. Found by review. Errors wrap kerr.InvalidRecord.
func checkReferences(kr *kgo.Record) error {
	for _, side := range []struct {
		marked bool
		b      []byte
		name   string
	}{{largemessage.IsKeyOffloaded(kr), kr.Key, "key"}, {largemessage.IsOffloaded(kr), kr.Value, "value"}} {
		if !side.marked {
			continue
		}
		if _, err := largemessage.DecodeReference(side.b); err != nil {
			return fmt.Errorf("%w: the record is marked as offloaded but its %s is not a PayloadReferenceValue: %v", kerr.InvalidRecord, side.name, err)
		}
	}
	return nil
}
