package largemessage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"regexp"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/serde"
	"github.com/twmb/franz-go/pkg/kgo"
)

var (
	// ErrPayloadNotFound is payloadstore.ErrPayloadNotFound: the referenced
	// object does not exist (expired by a TTL, deleted, never written).
	ErrPayloadNotFound = payloadstore.ErrPayloadNotFound
	// ErrDigestMismatch: the downloaded payload's SHA-256 differs from the
	// record's ferry.payload.sha256 header.
	ErrDigestMismatch = errors.New("payload SHA-256 does not match the record's digest header")
	// ErrSizeMismatch: the downloaded payload's length differs from the
	// record's ferry.payload.size header.
	ErrSizeMismatch = errors.New("payload size does not match the record's size header")
)

// RecordError is a record whose reference could not be resolved. It names
// the record (topic, partition, offset), the side ("key" or "value") and the
// referenced path; Err is one of ErrCorruptReference, ErrPayloadNotFound,
// payloadstore.ErrInvalidPath, ErrDigestMismatch, ErrSizeMismatch or a store
// error (test with errors.Is). Skipped is set when
// large.message.skip.not.found.error let the record through with a nil value.
type RecordError struct {
	Topic     string
	Partition int32
	Offset    int64
	Side      string
	Path      string
	Skipped   bool
	Err       error
}

func (e *RecordError) Error() string {
	s := fmt.Sprintf("topic %s partition %d offset %d: %s", e.Topic, e.Partition, e.Offset, e.Side)
	// The store's own error names the path already; say it once.
	var se *payloadstore.Error
	if e.Path != "" && !(errors.As(e.Err, &se) && se.Path == e.Path) {
		s += " reference " + payloadstore.Shorten(e.Path)
	}
	s += ": " + e.Err.Error()
	if e.Skipped {
		s += " (skipped: large.message.skip.not.found.error=true)"
	}
	return s
}

func (e *RecordError) Unwrap() error { return e.Err }

// Deserializer is KIP-1159's large-message Deserializer over franz-go
// records. It is safe for concurrent use.
type Deserializer struct {
	store        payloadstore.PayloadStore
	skipNotFound bool
	otherTopics  *regexp.Regexp // other topics whose objects may be read
	// keepKey, keepValue: that side's deserializer chain has no
	// large-message stage, so its reference is handed out as fetched.
	keepKey, keepValue bool
}

// NewDeserializer returns a Deserializer that downloads from store;
// skipNotFound is large.message.skip.not.found.error.
//
// A reference is resolved only when its object lies under the record's own
// topic in the store (docs/FORMAT.md §7), so that a record of one topic
// cannot make a consumer read another topic's payload; WithResolveTopics
// allows more topics.
func NewDeserializer(store payloadstore.PayloadStore, skipNotFound bool) *Deserializer {
	return &Deserializer{store: store, skipNotFound: skipNotFound}
}

// WithResolveTopics lets records reference objects of the topics re
// matches besides their own (large.message.reference.resolve.topics; nil:
// none) and returns d.
func (d *Deserializer) WithResolveTopics(re *regexp.Regexp) *Deserializer {
	d.otherTopics = re
	return d
}

// WithDeserializers makes d resolve only the sides whose chain has the
// large-message stage (key.deserializers, value.deserializers; a nil chain
// resolves its side, as the default chain large-message,bytes does) and
// returns d. A side whose chain has none, value.deserializers=bytes say,
// is handed out as fetched: the PayloadReferenceValue with its headers, as
// Kafka's ByteArrayDeserializer hands it out; the library's Producer never
// offloads such a side either.
func (d *Deserializer) WithDeserializers(key, value *serde.Chain) *Deserializer {
	d.keepKey = key != nil && !key.LargeMessage()
	d.keepValue = value != nil && !value.LargeMessage()
	return d
}

// Resolve replaces rec's referenced key and value by their payloads and
// removes the headers Ferry added, so the record reads as it was produced.
// A record without the headers is left exactly as it is.
//
// Errors are *RecordError. With skipNotFound, a missing payload sets the
// side to nil (the other side still resolves) and returns a *RecordError
// with Skipped set; any other error leaves rec unchanged.
func (d *Deserializer) Resolve(ctx context.Context, rec *kgo.Record) error {
	return d.resolve(ctx, rec, -1, keySide, valueSide)
}

// ResolveBounded is Resolve reading at most maxBytes of payload for a side
// without a size header (a KIP-only producer's reference); more fails with
// a *RecordError wrapping ErrSizeMismatch. Sides with a size header are
// bounded by it already. Each side's buffer is allocated once, up to
// maxBytes at a time (the proxy passes what it reserved in its memory
// budget).
func (d *Deserializer) ResolveBounded(ctx context.Context, rec *kgo.Record, maxBytes int64) error {
	return d.resolve(ctx, rec, maxBytes, keySide, valueSide)
}

// ResolveKey is Resolve for the key alone: the value stays as fetched, for
// a consumer that streams it with OpenValue.
func (d *Deserializer) ResolveKey(ctx context.Context, rec *kgo.Record) error {
	return d.resolve(ctx, rec, -1, keySide)
}

// resolve resolves sides of rec; maxBytes (>= 0) bounds a side without a
// size header.
func (d *Deserializer) resolve(ctx context.Context, rec *kgo.Record, maxBytes int64, sides ...side) error {
	// All sides are read before rec changes, so that an error leaves rec
	// as it was and a skipped side does not stop the other from resolving.
	var (
		payloads [2][]byte
		done     [2]bool
		skipped  error
	)
	for i, sd := range sides {
		if !marked(rec.Headers, sd.marker) || d.keeps(sd) {
			continue
		}
		refBytes := rec.Value
		if sd.name == "key" {
			refBytes = rec.Key
		}
		var buf bytes.Buffer
		rc, size, err := d.open(ctx, rec, sd, refBytes)
		if err == nil && size < 0 && maxBytes >= 0 {
			rc = &boundedReader{rc: rc, left: maxBytes, fail: func() error {
				ref, _ := DecodeReference(refBytes)
				return d.recordErr(rec, sd, ref.FullPayloadPath, fmt.Errorf("%w: more than the %d bytes allowed for a reference without a size header", ErrSizeMismatch, maxBytes))
			}}
		}
		if err == nil {
			// The buffer is allocated once, at its final size, where that
			// is known: from the size header (untrusted: up to
			// maxPrealloc, or up to maxBytes, which the caller has
			// accounted for) or, without one, maxBytes itself. MinRead
			// spare keeps ReadFrom from regrowing the full buffer just to
			// see EOF.
			pre := size
			if size < 0 {
				pre = maxBytes
			}
			if pre > 0 {
				buf.Grow(int(min(pre, max(maxPrealloc, maxBytes))) + bytes.MinRead)
			}
			_, err = io.Copy(&buf, rc)
			rc.Close()
			var re *RecordError
			if err != nil && !errors.As(err, &re) {
				ref, _ := DecodeReference(refBytes) // decoded fine in open
				err = d.recordErr(rec, sd, ref.FullPayloadPath, &payloadstore.Error{Op: "download", Path: ref.FullPayloadPath, Retryable: true, Err: err})
			}
		}
		if err != nil {
			var re *RecordError
			if errors.As(err, &re) && re.Skipped {
				skipped, done[i] = err, true
				continue
			}
			return err
		}
		payloads[i], done[i] = buf.Bytes(), true
		if payloads[i] == nil {
			payloads[i] = []byte{} // an empty payload, not a null
		}
	}
	for i, sd := range sides {
		if !done[i] {
			continue
		}
		if sd.name == "key" {
			rec.Key = payloads[i]
		} else {
			rec.Value = payloads[i]
		}
		rec.Headers = withoutSide(rec.Headers, sd)
	}
	return skipped
}

// keeps reports whether d hands sd out as fetched (WithDeserializers).
func (d *Deserializer) keeps(sd side) bool {
	if sd.name == "key" {
		return d.keepKey
	}
	return d.keepValue
}

// maxPrealloc bounds the buffer Resolve allocates from a size header before
// any byte has arrived; larger payloads grow the buffer as they stream.
const maxPrealloc = 64 << 20

// OpenValue returns a reader of rec's value payload and its size in bytes
// (-1 when a KIP-only producer gave no size header), for values too large to
// hold in memory. The reader checks size and SHA-256 as it streams and fails
// its last Read with a *RecordError wrapping ErrSizeMismatch or
// ErrDigestMismatch, so a consumer never accepts altered bytes silently.
// A record without the large-message header, or any record when
// value.deserializers has no large-message stage (WithDeserializers),
// yields its value itself.
func (d *Deserializer) OpenValue(ctx context.Context, rec *kgo.Record) (io.ReadCloser, int64, error) {
	if !IsOffloaded(rec) || d.keepValue {
		return io.NopCloser(bytes.NewReader(rec.Value)), int64(len(rec.Value)), nil
	}
	return d.open(ctx, rec, valueSide, rec.Value)
}

func (d *Deserializer) open(ctx context.Context, rec *kgo.Record, sd side, refBytes []byte) (io.ReadCloser, int64, error) {
	ref, err := DecodeReference(refBytes)
	if err != nil {
		return nil, 0, d.recordErr(rec, sd, "", err)
	}
	kp, err := payloadstore.ReferenceKey(d.store, ref.FullPayloadPath)
	if err == nil && kp.Topic != rec.Topic && (d.otherTopics == nil || !d.otherTopics.MatchString(kp.Topic)) {
		err = fmt.Errorf("%w: %s, the record is in topic %s (%s allows other topics)", payloadstore.ErrWrongTopic, kp.Topic, rec.Topic, KeyReferenceResolveTopics)
	}
	if err != nil {
		return nil, 0, d.recordErr(rec, sd, ref.FullPayloadPath, d.classHint(err, ref))
	}
	size, sum, ok, err := expected(rec.Headers, sd)
	if err != nil {
		return nil, 0, d.recordErr(rec, sd, ref.FullPayloadPath, err)
	}
	if ok {
		ctx = payloadstore.WithExpected(ctx, size, sum)
	}
	rc, err := d.store.Download(ctx, ref.FullPayloadPath)
	if err != nil {
		return nil, 0, d.recordErr(rec, sd, ref.FullPayloadPath, d.classHint(err, ref))
	}
	if !ok {
		return rc, -1, nil
	}
	return &verifier{rc: rc, r: io.LimitReader(rc, size+1), h: sha256.New(), size: size, sum: sum, path: ref.FullPayloadPath,
		fail: func(err error) error { return d.recordErr(rec, sd, ref.FullPayloadPath, err) }}, size, nil
}

// classHint adds to a path error the store class that wrote the reference
// when it is not this consumer's.
func (d *Deserializer) classHint(err error, ref PayloadReferenceValue) error {
	if errors.Is(err, payloadstore.ErrInvalidPath) && ref.PayloadStoreClass != d.store.Class() {
		return fmt.Errorf("%w (written by payload store class %s, this consumer uses %q)", err, payloadstore.Shorten(ref.PayloadStoreClass), d.store.Class())
	}
	return err
}

func (d *Deserializer) recordErr(rec *kgo.Record, sd side, path string, err error) error {
	return &RecordError{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Side: sd.name, Path: path,
		Skipped: d.skipNotFound && errors.Is(err, ErrPayloadNotFound), Err: err}
}

// verifier checks size and digest while a payload streams through.
type verifier struct {
	rc   io.ReadCloser
	r    io.Reader
	h    hash.Hash
	n    int64
	size int64
	sum  []byte
	path string
	fail func(error) error
	err  error
	head []byte // the first bytes, to tell an encrypted object in an error
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	v.n += int64(n)
	v.h.Write(p[:n])
	if len(v.head) < len(envelope.Magic) {
		v.head = append(v.head, p[:min(n, len(envelope.Magic)-len(v.head))]...)
	}
	switch {
	case v.n > v.size:
		v.err = v.fail(v.sealedHint(fmt.Errorf("%w: more than %d bytes", ErrSizeMismatch, v.size)))
		return 0, v.err
	case err == io.EOF:
		if v.n != v.size {
			v.err = v.fail(v.sealedHint(fmt.Errorf("%w: %d bytes, header says %d", ErrSizeMismatch, v.n, v.size)))
		} else if got := v.h.Sum(nil); !bytes.Equal(got, v.sum) {
			v.err = v.fail(fmt.Errorf("%w: got %x, header says %x", ErrDigestMismatch, got, v.sum))
		} else {
			v.err = io.EOF
		}
		return n, v.err
	case err != nil:
		var se *payloadstore.Error
		if !errors.As(err, &se) {
			err = &payloadstore.Error{Op: "download", Path: v.path, Retryable: true, Err: err}
		}
		v.err = v.fail(err)
		return n, v.err
	}
	return n, nil
}

func (v *verifier) Close() error { return v.rc.Close() }

// sealedHint puts first, for a size mismatch of an encrypted object read
// by a consumer without encryption configured, what it means.
func (v *verifier) sealedHint(err error) error {
	if envelope.IsSealed(v.head) {
		return fmt.Errorf("the payload is encrypted, and %s is not set: set it to the producer's key (read as they are, its sealed bytes fail the record's checks: %w)", KeyEncryptionKeyURL, err)
	}
	return err
}

// ResolvedGrowth says by how many bytes resolving rec will change its key
// and value, from the size headers Ferry writes (the payloads' sizes less
// the references'), without I/O. ok is false when a referenced side has no
// size header (a KIP-only producer) or a malformed one. The headers are the
// producer's word, but a download is checked against them (size and
// SHA-256): a payload cannot come back larger than its header says.
func ResolvedGrowth(rec *kgo.Record) (n int64, ok bool) {
	for _, sd := range []side{keySide, valueSide} {
		if !marked(rec.Headers, sd.marker) {
			continue
		}
		size, _, has, err := expected(rec.Headers, sd)
		if err != nil || !has {
			return 0, false
		}
		ref := rec.Value
		if sd == keySide {
			ref = rec.Key
		}
		n += size - int64(len(ref))
	}
	return n, true
}

// boundedReader fails once more than left bytes are read.
type boundedReader struct {
	rc   io.ReadCloser
	left int64
	fail func() error
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	if int64(n) > b.left {
		return 0, b.fail()
	}
	b.left -= int64(n)
	return n, err
}

func (b *boundedReader) Close() error { return b.rc.Close() }

// PayloadSizes returns the stored size of the objects rec's references
// name (key and value together), read from the store (ObjectStore.Stat):
// for references without size headers, whose growth ResolvedGrowth cannot
// tell. Errors: a reference that does not decode or lies outside the
// store, or the store's.
func PayloadSizes(ctx context.Context, store payloadstore.PayloadStore, rec *kgo.Record) (int64, error) {
	ops, err := payloadstore.Objects(store)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, sd := range []side{keySide, valueSide} {
		if !marked(rec.Headers, sd.marker) {
			continue
		}
		b := rec.Value
		if sd == keySide {
			b = rec.Key
		}
		ref, err := DecodeReference(b)
		if err != nil {
			return 0, err
		}
		key, err := ops.Root().Key(ref.FullPayloadPath)
		if err != nil {
			return 0, err
		}
		oi, err := ops.Stat(ctx, key)
		if err != nil {
			return 0, err
		}
		n += oi.Size
	}
	return n, nil
}
