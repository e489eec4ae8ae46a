package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/internal/ctxio"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// maxInMemory caps how much of an input is held in memory to let the exact
// sizing decide (it matters only with compression, where a record larger
// than the threshold may still fit once compressed).
const maxInMemory = 64 << 20

// sender produces one input (a file, bytes, stdin) as one record. Inputs
// that cannot fit inline whatever their compression go the streaming way:
// hashed from disk, published to the store by the serializer
// (Serializer.OffloadValue), and only the reference is produced. The rest
// is read into memory and produced with Producer.Produce, which decides
// exactly whether to offload. A record that fails has the payloads
// published for it released (sender.release), and every wait ends with the
// context (sender.deliver).
type sender struct {
	prod      *largemessage.Producer
	store     payloadstore.PayloadStore
	hasStore  bool
	codec     largemessage.Codec // the client's: never empty
	threshold int64              // large.message.threshold.bytes (0: derived)
	progress  bool               // draw progress bars on stderr
	stderr    io.Writer
	delivery  time.Duration // delivery.timeout.ms, for its error's text
	// answers counts the Produce responses read from the brokers (an
	// answer, an error or not): a record given up on after
	// delivery.timeout.ms either got none or was refused with retriable
	// errors.
	answers *produceAnswers
}

// produceAnswers is a franz-go hook counting the Produce responses read,
// and noting the records the brokers acknowledged (acked: *kgo.Record to
// struct{}; deliver deletes its record's entry).
type produceAnswers struct {
	n     atomic.Int64
	acked sync.Map
}

// OnProduceRecordUnbuffered notes an acknowledged record: franz-go calls it
// just before the record's promise, which for an offloaded record runs the
// Producer's Confirm (store I/O) before deliver hears of it.
func (h *produceAnswers) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if err == nil {
		h.acked.Store(r, struct{}{})
	}
}

func (h *produceAnswers) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == kmsg.Produce.Int16() && err == nil {
		h.n.Add(1)
	}
}

// openSender opens the payload store and the Kafka client (settings.open)
// and makes a sender over them; closeAll releases both.
func (s *settings) openSender(ctx context.Context, progress bool, stderr io.Writer) (*sender, *kgo.Client, func(), error) {
	answers := &produceAnswers{}
	store, cl, closeAll, err := s.open(ctx, kgo.WithHooks(answers))
	if err != nil {
		return nil, nil, nil, err
	}
	prod, err := largemessage.NewProducer(cl, store, s.cfg)
	if err != nil {
		closeAll()
		return nil, nil, nil, &usageError{err: err}
	}
	codec := s.cfg.Codec
	if codec.Type == "" {
		codec.Type = "none" // the client was made without compression (settings.clientOpts)
	}
	delivery, _ := s.deliveryTimeout() // checked by clientOpts
	return &sender{prod: prod, store: store, hasStore: s.cfg.StoreURL != "", codec: codec, threshold: s.cfg.Threshold,
		progress: progress, stderr: stderr, delivery: delivery, answers: answers}, cl, closeAll, nil
}

// Time limits of the clean-up after a failed or interrupted produce.
const (
	// safeAbortWait is how long an interrupted produce waits for the
	// client to abort its record at a safe point (not in flight).
	safeAbortWait = time.Second
	// abortWait bounds the wait for a record's promise once the context
	// ended and the client's buffered records were failed.
	abortWait = 5 * time.Second
	// cleanupTimeout bounds deleting a payload whose record was not
	// produced.
	cleanupTimeout = 15 * time.Second
	// deliveryGrace is how long deliver waits past delivery.timeout.ms
	// for franz-go to fail the record itself (with its last error) before
	// giving up on it: franz-go does not fail an idempotent record whose
	// produce request is unanswered (deliver's comment), so a broker
	// that stops answering would hold the record for ever. A record
	// given up on fails within delivery.timeout.ms + deliveryGrace +
	// safeAbortWait (2 s) of being handed to the client.
	deliveryGrace = time.Second
)

// sendError is an input that was not produced: why, and what became of the
// payloads published for it.
type sendError struct {
	name  string
	err   error
	notes []string // e.g. "its payload s3://... was deleted"
}

func (e *sendError) Error() string {
	msg := inputName(e.name) + ": " + e.err.Error()
	for _, n := range e.notes {
		msg += "; " + n
	}
	return msg
}

func (e *sendError) Unwrap() error { return e.err }

// delivery is the outcome of producing one record.
type delivery struct {
	rec *kgo.Record
	err error
	// sent: the produce failed, but its request went out and was not
	// answered, so the record may be in the topic.
	sent bool
	// abandoned: the client did not give the record back within abortWait
	// after ctx ended; rec may still be changing.
	abandoned bool
}

// deliver produces rec and waits for the broker's answer or for ctx to end.
// prepare: through the Producer, which offloads as needed
// (Producer.Produce); otherwise straight through the client (rec holds a
// reference already).
//
// When ctx ends first, the client's buffered records are aborted where that
// is safe (kgo's AbortBufferedRecords): a record not sent yet fails at once.
// A record still there after safeAbortWait is in flight: its request went
// out unanswered (franz-go keeps an idempotent record it sent until the
// broker answers, however long that takes), so it may be in the topic; it
// is then abandoned (UnsafeAbortBufferedRecords) and its promise awaited
// for at most abortWait.
//
// The same happens when the record is not acknowledged within
// delivery.timeout.ms (+ deliveryGrace) of being handed to the client:
// franz-go's RecordDeliveryTimeout is checked only before a request is
// written and after a response, and never fails an idempotent record whose
// request went out unanswered (a broker stopped with SIGSTOP, or hung, on a
// connection that stays open: franz-go's read deadline, ProduceRequestTimeout
// + RequestTimeoutOverhead, kills the connection and the record is sent
// again, for ever). The record then fails with errNotAcknowledged.
func (s *sender) deliver(ctx context.Context, rec *kgo.Record, prepare bool) delivery {
	done := make(chan delivery, 1)
	promise := func(r *kgo.Record, err error) { done <- delivery{rec: r, err: err} }
	// The record's context, ended when it is given up on: franz-go fails
	// a record whose context ended wherever that is safe.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if prepare {
		// Any payload is published before Produce returns: the
		// delivery timeout counts from then, as Java's from send().
		s.prod.Produce(rctx, rec, promise)
	} else {
		s.prod.Client().Produce(rctx, rec, promise)
	}
	answered := s.answers.n.Load()
	defer s.answers.acked.Delete(rec)
	giveUp := time.NewTimer(s.delivery + deliveryGrace)
	defer giveUp.Stop()
	var d delivery
	select {
	case d = <-done:
	case <-ctx.Done():
		d = s.abort(ctx, rec, done, context.Cause(ctx))
	case <-giveUp.C:
		if _, ok := s.answers.acked.Load(rec); ok {
			// Acknowledged: the Producer's Confirm (bounded by the
			// store's own timeouts) is still running. Wait for it, or
			// for an interrupt, as for any acknowledged record.
			select {
			case d = <-done:
			case <-ctx.Done():
				d = s.abort(ctx, rec, done, context.Cause(ctx))
			}
			break
		}
		cancel()
		d = s.abort(ctx, rec, done, errNotAcknowledged)
		if ctx.Err() == nil && (d.abandoned || errors.Is(d.err, kgo.ErrAborting) || errors.Is(d.err, context.Canceled)) {
			// The record failed because it was given up on (an
			// error of franz-go's own, arriving meanwhile, stays).
			d.err = s.notAcknowledged(d.sent, s.answers.n.Load() != answered)
		}
	}
	if d.rec == nil {
		d.rec = rec
	}
	if errors.Is(d.err, kgo.ErrRecordTimeout) && !errors.Is(d.err, errNotAcknowledged) {
		// franz-go names the last error only when a retry produced it.
		d.err = fmt.Errorf("%w (delivery.timeout.ms=%d: not acknowledged within it, retries included; the brokers, or a proxy's log, say why; -X %s=MS to wait longer)",
			d.err, s.delivery.Milliseconds(), keyDeliveryTimeout)
	}
	return d
}

// abort fails rec, whose promise goes to done, after ctx ended or its
// delivery timeout passed (why, for an abandoned record's error): at a safe
// point if the client reaches one within safeAbortWait, otherwise unsafely
// (the record was sent and is unanswered: d.sent). A promise that brings no
// error means the record was produced meanwhile.
func (s *sender) abort(ctx context.Context, rec *kgo.Record, done <-chan delivery, why error) delivery {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), safeAbortWait)
	err := s.prod.Client().AbortBufferedRecords(actx)
	cancel()
	inFlight := err != nil
	if inFlight {
		s.prod.Client().UnsafeAbortBufferedRecords()
	}
	var d delivery
	select {
	case d = <-done:
	case <-time.After(abortWait):
		d = delivery{rec: rec, err: why, abandoned: true}
	}
	d.sent = inFlight && d.err != nil
	return d
}

// errNotAcknowledged is the error of a record ferry gave up on after
// delivery.timeout.ms (sender.notAcknowledged gives the text).
var errNotAcknowledged = fmt.Errorf("not acknowledged within delivery.timeout.ms%w", noText{kgo.ErrRecordTimeout})

// notAcknowledged is the error of a record given up on after
// delivery.timeout.ms: sent says whether its produce request went out (and
// was not answered) or the record was still waiting in the client (or in
// the Producer, offloading it after MESSAGE_TOO_LARGE); answered, whether
// the brokers answered produce requests meanwhile (refusing the record).
func (s *sender) notAcknowledged(sent, answered bool) error {
	why := "the record was not sent: the client was still waiting on the broker (for a connection, metadata or a producer id)"
	switch {
	case sent && answered:
		why = "the broker answered its produce requests without accepting it (retriable errors: the brokers, or a proxy's log, say why), and the last one sent is unanswered"
	case sent:
		why = "its produce request was sent and not answered (a broker stopped or hung, or a network that drops packets)"
	case answered:
		why = "the broker answered its produce request without accepting it, and it was not sent again in time (after MESSAGE_TOO_LARGE ferry offloads the record and sends it once more; after retriable errors the client waits to retry: the brokers, or a proxy's log, say why)"
	}
	return fmt.Errorf("timed out after delivery.timeout.ms=%d without an acknowledgement: %s; -X %s=MS to wait longer%w",
		s.delivery.Milliseconds(), why, keyDeliveryTimeout, noText{errNotAcknowledged})
}

// release deals with the payloads published for a record whose produce
// failed, and says what became of each: one named by a random id is deleted
// unless the record may be in the topic (d.sent); one named by its content
// (an offloaded key, or values with the sha256 id generator) may be shared
// with other records and stays.
func (s *sender) release(ctx context.Context, d delivery) []string {
	if d.abandoned {
		return []string{"any payload published for it was left in the store (the Kafka client did not give the record back in time): ferry gc removes it"}
	}
	var notes []string
	for _, o := range []struct{ what, path string }{
		{"payload", referencePath(d.rec)}, {"key's payload", keyReferencePath(d.rec)},
	} {
		switch {
		case o.path == "":
		case d.sent:
			notes = append(notes, fmt.Sprintf("its %s %s was kept: the produce request was sent but not answered, so the record may be in the topic (ferry gc deletes the payload if it is not)", o.what, o.path))
		case payloadstore.IsContentID(o.path):
			notes = append(notes, fmt.Sprintf("its %s %s was kept: it is named by its content and may be shared with other records", o.what, o.path))
		default:
			if err := s.deleteObject(ctx, o.path); err != nil {
				notes = append(notes, fmt.Sprintf("its %s %s could not be deleted (%v): ferry gc or the store's TTL removes it", o.what, o.path, err))
			} else {
				notes = append(notes, fmt.Sprintf("its %s %s was deleted", o.what, o.path))
			}
		}
	}
	return notes
}

// deleteObject deletes an object whose reference was never produced, even
// after ctx ended, within cleanupTimeout.
func (s *sender) deleteObject(ctx context.Context, path string) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := s.store.Delete(dctx, path)
	if err != nil {
		slog.Debug("could not delete an unreferenced payload", "path", path, "err", err)
	}
	return err
}

// tooLarge is the error for a record that cannot fit topic even with what
// could be offloaded: one sentence naming the topic, the limit and where it
// comes from, then detail if any. cause (the library's error) stays in the
// chain, not in the text.
func (s *sender) tooLarge(ctx context.Context, topic, offloaded, detail string, cause error) error {
	l := s.prod.Limits(ctx, topic)
	limit := fmt.Sprintf("%d bytes, from the topic's max.message.bytes (%d bytes) and the client's max.request.size", l.Threshold, l.MaxMessageBytes)
	if s.threshold > 0 && s.threshold == l.Threshold {
		limit = fmt.Sprintf("%d bytes, set by %s", l.Threshold, largemessage.KeyThreshold)
	}
	msg := fmt.Sprintf("the record cannot fit topic %s even with its %s offloaded: the limit is %s", topic, offloaded, limit)
	if detail != "" {
		msg += " (" + detail + ")"
	}
	return fmt.Errorf("%s%w", msg, noText{cause})
}

// sent describes one produced record.
type sent struct {
	Name       string
	Topic      string
	Partition  int32
	Offset     int64
	Size       int64 // bytes of the input (the record's value as produced)
	SHA256     [sha256.Size]byte
	Offloaded  bool
	Path       string // full payload path when offloaded
	KafkaBytes int64  // key + value + headers as stored in Kafka
}

func (s sent) line() string {
	if s.Offloaded {
		return fmt.Sprintf("%s/%d@%d %d bytes offloaded %s", s.Topic, s.Partition, s.Offset, s.Size, s.Path)
	}
	return fmt.Sprintf("%s/%d@%d %d bytes inline", s.Topic, s.Partition, s.Offset, s.Size)
}

// cutoff is the input size above which a record is offloaded whatever the
// codec does: the threshold without compression; with compression, the
// client's uncompressed batch cap (bounded by maxInMemory), since a larger
// input may still compress under the threshold.
func (s *sender) cutoff(ctx context.Context, topic string) (largemessage.Limits, int64) {
	l := s.prod.Limits(ctx, topic)
	c := l.Threshold
	if s.codec.Type != "none" && s.codec.Type != "" && l.ClientBatchMaxBytes > c {
		c = min(l.ClientBatchMaxBytes, maxInMemory)
	}
	return l, c
}

// sendInline produces value as it is, never offloaded: what a value chain
// without a large-message stage wrote (value.serializers=avro). A record
// that does not fit the topic inline (exact sizing, KIP-126) is refused
// before it is sent, naming the stage that would offload it, instead of
// failing at the broker with MESSAGE_TOO_LARGE.
func (s *sender) sendInline(ctx context.Context, topic, name, chain string, key, value []byte, hs []kgo.RecordHeader) (sent, error) {
	out := sent{Name: name, Size: int64(len(value)), SHA256: sha256.Sum256(value)}
	l := s.prod.Limits(ctx, topic)
	fits, err := s.codec.Fits(l, key, value, hs)
	if err != nil {
		return out, err
	}
	if !fits {
		return out, fmt.Errorf("the encoded record (%d bytes) does not fit topic %s inline (limit %d bytes), and value.serializers %s has no large-message stage to offload it: use value.serializers=%s,large-message%w",
			largemessage.RecordLen(key, value, hs), topic, l.Threshold, chain, chain, noText{largemessage.ErrRecordTooLarge})
	}
	d := s.deliver(ctx, &kgo.Record{Topic: topic, Key: key, Value: value, Headers: hs}, false)
	if d.err != nil {
		return out, d.err
	}
	return s.result(out, d.rec), nil
}

// sendInlineInput produces input in (a file, or standard input for "-")
// as it is, never offloaded (value.serializers without large-message). It
// reads at most what could fit the topic inline (the client's uncompressed
// batch cap): a longer input is refused without being read whole.
func (s *sender) sendInlineInput(ctx context.Context, topic, in, chain string, key []byte, stdin io.Reader, hs []kgo.RecordHeader) (sent, error) {
	r := stdin
	if in != "-" {
		f, err := os.Open(in)
		if err != nil {
			return sent{Name: in}, err
		}
		defer f.Close()
		r = f
	}
	l, cut := s.cutoff(ctx, topic)
	b, err := io.ReadAll(io.LimitReader(r, cut+1))
	if err != nil {
		return sent{Name: in}, fmt.Errorf("%s: %w", inputName(in), err)
	}
	if int64(len(b)) > cut {
		return sent{Name: in}, fmt.Errorf("%s (more than %d bytes) does not fit topic %s inline (limit %d bytes), and value.serializers %s has no large-message stage to offload it: use value.serializers=%s,large-message%w",
			inputName(in), cut, topic, l.Threshold, chain, chain, noText{largemessage.ErrRecordTooLarge})
	}
	return s.sendInline(ctx, topic, in, chain, key, b, hs)
}

// sendBytes produces value through the Producer, which decides exactly
// whether to offload.
func (s *sender) sendBytes(ctx context.Context, topic, name string, key, value []byte, hs []kgo.RecordHeader) (sent, error) {
	out := sent{Name: name, Size: int64(len(value)), SHA256: sha256.Sum256(value)}
	d := s.deliver(ctx, &kgo.Record{Topic: topic, Key: key, Value: value, Headers: hs}, true)
	if d.err == nil {
		return s.result(out, d.rec), nil
	}
	notes := s.release(ctx, d)
	err := d.err
	switch {
	case errors.Is(err, errNoStore):
		l := s.prod.Limits(ctx, topic)
		err = fmt.Errorf("the record (%d bytes) is over the threshold of topic %s (%d bytes) and must be offloaded, but %w",
			largemessage.RecordLen(key, value, hs), topic, l.Threshold, errNoStore)
	case errors.Is(err, largemessage.ErrRecordTooLarge):
		err = s.tooLarge(ctx, topic, "key and value", "", err)
	}
	return out, &sendError{name: name, err: err, notes: notes}
}

func (s *sender) result(out sent, r *kgo.Record) sent {
	out.Topic, out.Partition, out.Offset = r.Topic, r.Partition, r.Offset
	out.Offloaded = largemessage.IsOffloaded(r)
	out.Path = referencePath(r)
	out.KafkaBytes = recordBytes(r)
	return out
}

// sendFile produces the file at path as one record, with its base name
// in the header ferry.file.name (consume --out names the file after it).
func (s *sender) sendFile(ctx context.Context, topic, name string, key []byte, path string) (sent, error) {
	f, err := os.Open(path)
	if err != nil {
		return sent{Name: name}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return sent{Name: name}, err
	}
	if !st.Mode().IsRegular() {
		return sent{Name: name}, fmt.Errorf("%s: not a regular file", path)
	}
	return s.sendOpen(ctx, topic, name, key, f, st.Size(), fileNameHeaders(path))
}

// sendOpen produces the open file f of size bytes.
func (s *sender) sendOpen(ctx context.Context, topic, name string, key []byte, f *os.File, size int64, hs []kgo.RecordHeader) (sent, error) {
	l, cut := s.cutoff(ctx, topic)
	if size <= cut {
		b := make([]byte, size)
		if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && size == 0) {
			return sent{Name: name}, fmt.Errorf("%s: %w", name, err)
		}
		return s.sendBytes(ctx, topic, name, key, b, hs)
	}
	if !s.hasStore {
		return sent{Name: name}, s.needStore(name, size, topic, l)
	}
	return s.stream(ctx, topic, name, key, f, size, hs)
}

func (s *sender) needStore(name string, size int64, topic string, l largemessage.Limits) error {
	if s.codec.Type != "none" && s.codec.Type != "" && l.ClientBatchMaxBytes > l.Threshold && size > l.ClientBatchMaxBytes {
		// With compression the cut is the client's batch cap, which
		// bounds a record before compression: however well the file
		// compresses, it cannot go inline unless that is raised.
		return fmt.Errorf("%s (%d bytes) is larger than the client's max.request.size (%d bytes, a bound on the record before %s compression; raise it to send a file that compresses under topic %s's max.message.bytes inline) and must be offloaded, but %w",
			name, size, l.ClientBatchMaxBytes, s.codec.Type, topic, errNoStore)
	}
	return fmt.Errorf("%s (%d bytes) is larger than topic %s accepts inline (threshold %d bytes) and must be offloaded, but %w",
		name, size, topic, l.Threshold, errNoStore)
}

// keyBesideReference checks that rec, whose value is a reference, fits
// topic: the key of a streamed input is not offloaded. The error is a
// *sendError.
func (s *sender) keyBesideReference(ctx context.Context, topic, name string, rec *kgo.Record) error {
	fits, err := s.codec.Fits(s.prod.Limits(ctx, topic), rec.Key, rec.Value, rec.Headers)
	if err != nil || fits {
		return nil
	}
	detail := fmt.Sprintf("with the reference and its headers the record is %d bytes, its key %d; the key of a streamed input is not offloaded",
		largemessage.RecordLen(rec.Key, rec.Value, rec.Headers), len(rec.Key))
	return &sendError{name: name, err: s.tooLarge(ctx, topic, "value", detail, largemessage.ErrRecordTooLarge)}
}

// stream offloads f without reading it into memory, then produces the
// reference.
func (s *sender) stream(ctx context.Context, topic, name string, key []byte, f *os.File, size int64, hs []kgo.RecordHeader) (sent, error) {
	out := sent{Name: name, Size: size}
	// The store hashes the file as it writes it (one pass) unless it needs
	// the digest first (a content id, a cloud store): then it is hashed
	// here, with its own progress bar. Either way a file that changes
	// meanwhile fails the publish (payloadstore.ErrPayloadChanged).
	p := payloadstore.StreamPayload(f, size)
	if !payloadstore.OnePass(s.store, p) {
		// Hashing a large file takes a while: it stops with ctx.
		var err error
		p, err = hashWithProgress(ctx, f, size, s.bar(size, "hashing   "+name))
		if err != nil {
			return out, fmt.Errorf("%s: reading: %w", name, err)
		}
		if p.Size != size {
			return out, fmt.Errorf("%s: changed while it was read (%d bytes, then %d)", name, size, p.Size)
		}
	}
	// Decided before anything is published: the key is not offloaded
	// here, so it must fit beside the reference the value will get.
	if pre, err := s.prod.Serializer().PreviewValue(&kgo.Record{Topic: topic, Key: key, Headers: hs}, p); err != nil {
		return out, &sendError{name: name, err: fmt.Errorf("offloading: %w", err)}
	} else if pre != nil {
		if err := s.keyBesideReference(ctx, topic, name, pre); err != nil {
			return out, err
		}
	}
	if s.progress {
		body := &progressBody{rs: f, bar: s.bar(size, "uploading "+name)}
		defer body.bar.finish()
		p.Body = body
	}
	rec := &kgo.Record{Topic: topic, Key: key, Headers: hs}
	// A file changed since it was hashed fails here with
	// payloadstore.ErrPayloadChanged, its object deleted; an interrupted
	// upload is aborted.
	did, err := s.prod.Serializer().OffloadValue(ctx, rec, p)
	if err != nil {
		return out, &sendError{name: name, err: fmt.Errorf("offloading: %w", err)}
	}
	out.SHA256 = did.ValueSHA256
	// Again with the reference as published (a store may add metadata).
	if err := s.keyBesideReference(ctx, topic, name, rec); err != nil {
		err.(*sendError).notes = s.release(ctx, delivery{rec: rec})
		return out, err
	}
	d := s.deliver(ctx, rec, false)
	if d.err != nil {
		return out, &sendError{name: name, err: fmt.Errorf("producing the reference: %w", d.err), notes: s.release(ctx, d)}
	}
	if err := s.confirmStreamed(ctx, rec, f, size, did.ValueSHA256); err != nil {
		return out, &sendError{name: name, err: fmt.Errorf("the record is at partition %d offset %d, but %w", d.rec.Partition, d.rec.Offset, err)}
	}
	return s.result(out, d.rec), nil
}

// confirmStreamed is Plan.Confirm for a streamed value (the Producer does
// it for the others): after the acknowledgement, an object ferry gc
// quarantined meanwhile is copied back, and one it deleted is published
// again from f (same id; a file changed since fails with
// payloadstore.ErrPayloadChanged).
func (s *sender) confirmStreamed(ctx context.Context, rec *kgo.Record, f *os.File, size int64, digest [32]byte) error {
	ref, err := largemessage.DecodeReference(rec.Value)
	if err != nil {
		return nil // not a reference: nothing to confirm
	}
	path := ref.FullPayloadPath
	kp, err := payloadstore.PathKey(path)
	if err != nil {
		return nil
	}
	c, err := payloadstore.Confirm(context.WithoutCancel(ctx), s.store, path, &payloadstore.Digest{Size: size, SHA256: digest}, func(ctx context.Context) error {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		resp, err := s.store.Publish(ctx, rec.Topic, payloadstore.Payload{Body: f, Size: size, SHA256: digest, ID: kp.ID})
		if err != nil {
			return err
		}
		if resp.FullPayloadPath != path {
			return fmt.Errorf("the store published it at %s", resp.FullPayloadPath)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("its payload %s is gone: %w", path, err)
	}
	if c != payloadstore.Present {
		slog.Warn("a payload was quarantined or deleted by ferry gc before its record's acknowledgement arrived; brought back", "topic", rec.Topic, "path", path, "how", c.String())
	}
	return nil
}

// sendStdin reads r up to the cutoff into memory; a larger input is spooled
// to a temporary file and streamed from there.
func (s *sender) sendStdin(ctx context.Context, topic, name string, key []byte, r io.Reader, hs []kgo.RecordHeader) (sent, error) {
	l, cut := s.cutoff(ctx, topic)
	head, err := io.ReadAll(io.LimitReader(r, cut+1))
	if err != nil {
		return sent{Name: name}, fmt.Errorf("reading standard input: %w", err)
	}
	if int64(len(head)) <= cut {
		return s.sendBytes(ctx, topic, name, key, head, hs)
	}
	if !s.hasStore {
		return sent{Name: name}, fmt.Errorf("standard input (more than %d bytes) is larger than topic %s accepts inline (threshold %d bytes) and must be offloaded, but %w",
			cut, topic, l.Threshold, errNoStore)
	}
	tmp, err := os.CreateTemp("", "ferry-stdin-*")
	if err != nil {
		return sent{Name: name}, fmt.Errorf("spooling standard input: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	var bar *progress
	if s.progress {
		bar = s.bar(-1, "reading   stdin")
	}
	n, err := io.Copy(io.MultiWriter(tmp, bar), io.MultiReader(bytes.NewReader(head), ctxio.Reader(ctx, r)))
	bar.finish()
	if err != nil {
		return sent{Name: name}, fmt.Errorf("spooling standard input to %s: %w", tmp.Name(), err)
	}
	slog.Debug("standard input spooled", "file", tmp.Name(), "bytes", n)
	return s.stream(ctx, topic, name, key, tmp, n, hs)
}

// hashWithProgress is payloadstore.FilePayload with cancellation and a
// progress bar (none when bar is nil).
func hashWithProgress(ctx context.Context, f *os.File, size int64, bar *progress) (payloadstore.Payload, error) {
	defer bar.finish()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return payloadstore.Payload{}, err
	}
	h := sha256.New()
	n, err := ctxio.Copy(ctx, io.MultiWriter(h, bar), f)
	if err != nil {
		return payloadstore.Payload{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return payloadstore.Payload{}, err
	}
	p := payloadstore.Payload{Body: f, Size: n}
	copy(p.SHA256[:], h.Sum(nil))
	return p, nil
}

// progressBody advances a progress bar as the store reads a payload body; a
// seek back to the start (a retry) starts the bar over. (That the bytes read
// match the payload's SHA-256 is the store policy's check:
// payloadstore.ErrPayloadChanged.)
type progressBody struct {
	rs  io.ReadSeeker
	bar *progress
}

func (b *progressBody) Read(p []byte) (int, error) {
	n, err := b.rs.Read(p)
	b.bar.add(n)
	return n, err
}

func (b *progressBody) Seek(offset int64, whence int) (int64, error) {
	pos, err := b.rs.Seek(offset, whence)
	if err == nil && pos == 0 {
		b.bar.set(0)
	}
	return pos, err
}
