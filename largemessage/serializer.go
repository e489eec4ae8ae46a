package largemessage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sync"

	"github.com/ferrykit/ferry/internal/crc32c"
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
	// verifyRefs: a reference a record arrives with gets its size and
	// digest headers from the object itself (WithVerifiedReferences).
	verifyRefs bool
}

// WithVerifiedReferences makes Adopt read every object a record arrives
// referencing and write the record's size and SHA-256 headers from what it
// read, dropping custom metadata headers (KIP-917 metadata comes from the
// store at publish time only). For producers that are not trusted (the
// proxy's clients): a reference with headers that lie about its object
// would otherwise fail every consumer at that offset. It costs one read of
// the object. It returns s.
func (s *Serializer) WithVerifiedReferences() *Serializer {
	s.verifyRefs = true
	return s
}

// ReferenceCache is what one request's references share (see
// WithReferenceCache): the objects verified and the objects touched.
type ReferenceCache struct {
	mu       sync.Mutex
	verified map[string]verifiedObject
	touched  map[string]bool
}

type verifiedObject struct {
	size int64
	sum  [32]byte
	crc  uint32
}

type referenceCacheKey struct{}

// WithReferenceCache returns a context whose Adopt, PlanOffload and Commit
// calls share one ReferenceCache: an object that references of several
// records name (of one Produce request, in the proxy) is read and hashed
// once for WithVerifiedReferences and touched once, not once per record.
// The cache lives as long as the context: give it one request's work.
func WithReferenceCache(ctx context.Context) context.Context {
	return context.WithValue(ctx, referenceCacheKey{}, &ReferenceCache{verified: map[string]verifiedObject{}, touched: map[string]bool{}})
}

func referenceCache(ctx context.Context) *ReferenceCache {
	c, _ := ctx.Value(referenceCacheKey{}).(*ReferenceCache)
	return c
}

// verifyReference reads the object at path and sets rec's headers of side
// sd to its size and digest (once per path with a ReferenceCache).
func (s *Serializer) verifyReference(ctx context.Context, rec *kgo.Record, sd side, path string) error {
	cache := referenceCache(ctx)
	if cache != nil {
		cache.mu.Lock()
		v, ok := cache.verified[path]
		cache.mu.Unlock()
		if ok {
			rec.Headers = append(withoutSide(slices.Clone(rec.Headers), sd), sideHeaders(sd, v.size, v.sum, &v.crc, nil)...)
			return nil
		}
	}
	rc, err := s.store.Download(ctx, path)
	if err != nil {
		return fmt.Errorf("topic %s: the record's %s is a reference: %w", rec.Topic, sd.name, err)
	}
	defer rc.Close()
	h := sha256.New()
	c := crc32.New(crc32c.Table)
	n, err := io.Copy(io.MultiWriter(h, c), rc)
	if err != nil {
		return fmt.Errorf("topic %s: the record's %s is a reference: reading its object: %w", rec.Topic, sd.name, err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	crc := c.Sum32()
	rec.Headers = append(withoutSide(slices.Clone(rec.Headers), sd), sideHeaders(sd, n, sum, &crc, nil)...)
	if cache != nil {
		cache.mu.Lock()
		cache.verified[path] = verifiedObject{size: n, sum: sum, crc: crc}
		cache.mu.Unlock()
	}
	return nil
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
	// ValueSHA256 is the SHA-256 of the value published (OffloadValue;
	// for an Unhashed payload, as the store computed it while writing).
	ValueSHA256 [sha256.Size]byte
}

// Offload makes rec fit l. A record that fits (Codec.Fits) is left exactly
// as it is: no copy, no header. Otherwise its value, then if needed its key,
// is published to the store and replaced by a PayloadReferenceValue, with the
// headers of docs/FORMAT.md appended. The larger side goes first. A nil value
// (a tombstone) is never offloaded; a key is offloaded under its content id,
// so equal keys keep equal bytes in Kafka (partitioning, compaction).
//
// The decision is made before anything is published (PlanOffload): a record
// that cannot fit even with key and value offloaded fails with
// ErrRecordTooLarge and leaves nothing in the store.
//
// A record that arrives already carrying Ferry's headers (re-produced from a
// consumed record: a dead-letter or retry topic, a mirror) is adopted first
// (see Adopt): a side whose bytes are not a reference loses the stale headers
// and is sized as a plain value; a reference is re-bound to rec's topic.
//
// Errors: a store failure (an *payloadstore.Error, after the policy's
// retries), ErrRecordTooLarge, Adopt's errors, or ctx's error. On error rec
// may have its value replaced but must not be produced; the objects this
// call published are deleted again, except those named by content id, which
// other records may share.
func (s *Serializer) Offload(ctx context.Context, rec *kgo.Record, l Limits) (Offloaded, error) {
	p, err := s.offload(ctx, rec, l)
	if err != nil || p == nil {
		return Offloaded{}, err
	}
	return p.Did, nil
}

// offload is Offload returning the committed plan (nil when rec is left
// as it is), for Plan.Confirm after the record's acknowledgement.
func (s *Serializer) offload(ctx context.Context, rec *kgo.Record, l Limits) (*Plan, error) {
	p, err := s.PlanOffload(ctx, rec, l)
	if err != nil || p == nil {
		return nil, err
	}
	if err := p.commitChecked(ctx, l); err != nil {
		return nil, err
	}
	return p, nil
}

// untouched reports, without I/O or compression, that Offload would leave
// rec exactly as it is under l: it carries none of Ferry's markers (nothing
// to adopt) and its size alone says it fits (Codec.fitsBySize). false means
// Offload must decide. u is RecordLen of rec.
func (s *Serializer) untouched(rec *kgo.Record, l Limits, u int64) bool {
	for _, h := range rec.Headers {
		if h.Key == HeaderLargeMessage || h.Key == HeaderLargeMessageKey {
			return false
		}
	}
	fits, decided := s.codec.fitsBySize(l, u)
	return decided && fits
}

// Plan is a record whose offload is decided but not yet published: the
// record already holds the references its payloads will have (their ids are
// fixed, so the references are exact). Commit publishes the payloads.
type Plan struct {
	s       *Serializer
	rec     *kgo.Record
	sides   []sidePlan
	rebinds []payloadstore.Rebinding // references re-bound to the record's topic (Adopt)
	rebound int                      // how many rebinds Commit did
	// Did says which sides the plan offloads and how many payload bytes
	// Commit publishes.
	Did Offloaded
	// published are the full paths Commit wrote, for Abort.
	published []string
}

// sidePlan is one side to publish: its payload with a fixed id, and the
// full path the reference names.
type sidePlan struct {
	sd   side
	p    payloadstore.Payload
	path string
	// crc is the payload's CRC-32C when crcKnown: taken with its SHA-256
	// for bytes in memory (planSide), or while the store reads the body
	// (Commit) for a payload given as a stream.
	crc      uint32
	crcKnown bool
}

// PlanOffload decides, without publishing, which sides of rec to offload so
// that it fits l (see Offload) and rewrites rec with the references they
// will have. It returns nil when rec fits as it is (after Adopt). Errors:
// ErrRecordTooLarge (nothing published), Adopt's errors, ErrNoPayloadStore.
func (s *Serializer) PlanOffload(ctx context.Context, rec *kgo.Record, l Limits) (*Plan, error) {
	return s.plan(ctx, rec, l, planFit)
}

// PlanValue is PlanOffload offloading rec's value whatever its size (then
// its key, if the record still does not fit). When the value cannot be
// offloaded (null, already a reference, or no large-message stage) it
// returns nil if the record fits, else ErrRecordTooLarge. It is how the proxy makes a batch of records that each fit
// smaller, and how the Producer recovers a record the broker refused.
func (s *Serializer) PlanValue(ctx context.Context, rec *kgo.Record, l Limits) (*Plan, error) {
	return s.plan(ctx, rec, l, planForceValue)
}

// PlanKey is PlanOffload for a record whose value is already a reference
// with its headers, published apart and checked by the caller (a value the
// proxy streamed to the store as it arrived): the value is left as it is
// (not adopted: its object is not read again), and the key is offloaded,
// as PlanOffload offloads it after the value, when the record does not fit
// l otherwise. It returns nil when the record fits as it is. Errors:
// ErrRecordTooLarge (nothing published), ErrNoPayloadStore.
func (s *Serializer) PlanKey(ctx context.Context, rec *kgo.Record, l Limits) (*Plan, error) {
	return s.plan(ctx, rec, l, planKeyOnly)
}

// planMode is what plan may offload.
type planMode int

const (
	planFit        planMode = iota // PlanOffload: what the record needs to fit
	planForceValue                 // PlanValue: the value whatever its size, then the key if needed
	planKeyOnly                    // PlanKey: the value is a reference already; the key if needed
)

func (s *Serializer) plan(ctx context.Context, rec *kgo.Record, l Limits, mode planMode) (*Plan, error) {
	force := mode == planForceValue
	var keyRef, valueRef bool
	var rebinds []payloadstore.Rebinding
	if mode == planKeyOnly {
		keyRef, valueRef = marked(rec.Headers, keySide.marker), true
	} else {
		var err error
		if keyRef, valueRef, rebinds, err = s.adopt(ctx, rec); err != nil {
			return nil, err
		}
	}
	var err error
	canValue := !valueRef && !s.noValue && rec.Value != nil
	canKey := !keyRef && !s.noKey && rec.Key != nil
	var fits bool
	if !force || !canValue {
		if fits, err = s.codec.Fits(l, rec.Key, rec.Value, rec.Headers); err != nil {
			return nil, err
		}
	}
	if fits && (!force || !canValue) {
		if len(rebinds) == 0 {
			return nil, nil
		}
		return &Plan{s: s, rec: rec, rebinds: rebinds}, nil
	}
	if force && !canValue {
		return nil, s.tooLarge(rec, l)
	}
	// The orders to try: the larger side first, then both.
	var orders [][]side
	switch {
	case canValue && (force || len(rec.Value) >= len(rec.Key) || !canKey):
		orders = [][]side{{valueSide}}
		if canKey {
			orders = append(orders, []side{valueSide, keySide})
		}
	case canKey:
		orders = [][]side{{keySide}}
		if canValue {
			orders = append(orders, []side{keySide, valueSide})
		}
	}
	if s.store != nil && s.root() == "" {
		return s.publishFirst(ctx, rec, l, orders) // (a store without ObjectStore has no rebinds)
	}
	var last *kgo.Record
	for _, order := range orders {
		var sps []sidePlan
		for _, sd := range order {
			if sd == keySide && !canKey || sd == valueSide && !canValue {
				continue
			}
			sp, err := s.planSide(rec, sd)
			if err != nil {
				return nil, err
			}
			sps = append(sps, sp)
		}
		predicted := cloneRecord(rec)
		for _, sp := range sps {
			if err := sp.apply(predicted, sp.path, nil, s.storeClass()); err != nil {
				return nil, err
			}
		}
		last = predicted
		if fits, err := s.codec.Fits(l, predicted.Key, predicted.Value, predicted.Headers); err != nil {
			return nil, err
		} else if fits {
			p := &Plan{s: s, rec: rec, sides: sps, rebinds: rebinds}
			for _, sp := range sps {
				p.markDid(sp)
			}
			rec.Key, rec.Value, rec.Headers = predicted.Key, predicted.Value, predicted.Headers
			return p, nil
		}
	}
	if last == nil {
		last = rec
	}
	return nil, s.tooLarge(last, l)
}

// publishFirst is plan for a store whose paths cannot be predicted: each
// side of the last (fullest) order is published and measured in turn, and the plan
// comes back committed. Such a store may keep objects of a record that then
// does not fit (they are deleted unless named by content id).
func (s *Serializer) publishFirst(ctx context.Context, rec *kgo.Record, l Limits, orders [][]side) (*Plan, error) {
	p := &Plan{s: s, rec: rec}
	if len(orders) == 0 {
		return nil, s.tooLarge(rec, l)
	}
	for _, sd := range orders[len(orders)-1] {
		b := rec.Value
		if sd == keySide {
			b = rec.Key
		}
		if b == nil || sd == keySide && s.noKey || sd == valueSide && s.noValue || marked(rec.Headers, sd.marker) {
			continue
		}
		sp, err := s.planSide(rec, sd)
		if err != nil {
			return nil, err
		}
		p.sides = []sidePlan{sp}
		if _, err := p.Commit(ctx); err != nil {
			return nil, err
		}
		p.markDid(sp)
		if fits, err := s.codec.Fits(l, rec.Key, rec.Value, rec.Headers); err != nil || fits {
			p.sides = nil
			return p, err
		}
	}
	p.Abort(ctx)
	return nil, s.tooLarge(rec, l)
}

func (p *Plan) markDid(sp sidePlan) {
	if sp.sd == keySide {
		p.Did.Key = true
	} else {
		p.Did.Value = true
	}
	p.Did.StoredBytes += sp.p.Size
}

func cloneRecord(r *kgo.Record) *kgo.Record {
	c := *r
	c.Headers = slices.Clone(r.Headers)
	return &c
}

func (s *Serializer) storeClass() string {
	if s.store == nil {
		return ""
	}
	return s.store.Class()
}

// planSide fixes the id of rec's side sd and works out its full path.
func (s *Serializer) planSide(rec *kgo.Record, sd side) (sidePlan, error) {
	b := rec.Value
	if sd == keySide {
		b = rec.Key
	}
	if s.store == nil {
		return sidePlan{}, fmt.Errorf("topic %s: the %s (%d bytes) must be offloaded: %w", rec.Topic, sd.name, len(b), ErrNoPayloadStore)
	}
	if err := needTopic(rec, sd); err != nil {
		return sidePlan{}, err
	}
	p, crc := bytesPayload(b)
	if sd == keySide {
		p.ID = p.HexSHA256()
	} else {
		p.ID = s.store.ID(p)
	}
	sp := sidePlan{sd: sd, p: p, crc: crc, crcKnown: true}
	root := s.root()
	if root == "" {
		return sp, nil // planned after publishing (see plan)
	}
	key, err := payloadstore.ObjectKey(rec.Topic, p.ID)
	if err != nil {
		return sidePlan{}, fmt.Errorf("topic %s: %w", rec.Topic, err)
	}
	sp.path = root.Path(key)
	return sp, nil
}

// root is the store's root, "" for a store without ObjectStore (one
// registered from outside this module), whose paths cannot be predicted.
func (s *Serializer) root() payloadstore.Root {
	if ops, err := payloadstore.Objects(s.store); err == nil {
		return ops.Root()
	}
	return ""
}

// apply sets rec's side to a reference to path with its headers.
func (sp sidePlan) apply(rec *kgo.Record, path string, metadata []byte, class string) error {
	ref, err := PayloadReferenceValue{FullPayloadPath: path, PayloadStoreClass: class}.AppendTo(nil)
	if err != nil {
		return fmt.Errorf("topic %s: %w", rec.Topic, err)
	}
	// The CRC header is written only when the CRC is known: a wrong one
	// would make the proxy stream a batch whose CRC-32C is wrong.
	var crc *uint32
	if sp.crcKnown {
		crc = &sp.crc
	}
	// A copy: the caller may share one header slice between records.
	rec.Headers = append(withoutSide(slices.Clone(rec.Headers), sp.sd), sideHeaders(sp.sd, sp.p.Size, sp.p.SHA256, crc, metadata)...)
	if sp.sd == keySide {
		rec.Key = ref
	} else {
		rec.Value = ref
	}
	return nil
}

// Commit publishes the plan's payloads. When the store answers with
// another path than planned, or with custom metadata (KIP-917), the
// record's reference and headers are updated and changed is true: the
// caller must measure the record again. On error, the objects Commit
// published are deleted (except content ids) and the record must not be
// produced.
func (p *Plan) Commit(ctx context.Context) (changed bool, err error) {
	cache := referenceCache(ctx)
	for _, rb := range p.rebinds[p.rebound:] {
		// A touch is done once per object with a ReferenceCache.
		touch := rb.Src == rb.Dst
		if touch && cache != nil {
			cache.mu.Lock()
			done := cache.touched[rb.Src]
			cache.mu.Unlock()
			if done {
				p.rebound++
				continue
			}
		}
		if err := rb.Do(ctx, p.s.store); err != nil {
			p.Abort(ctx)
			return false, fmt.Errorf("topic %s: re-binding a reference: %w", p.rec.Topic, err)
		}
		if touch && cache != nil {
			cache.mu.Lock()
			cache.touched[rb.Src] = true
			cache.mu.Unlock()
		}
		p.rebound++
	}
	for i := range p.sides {
		sp := &p.sides[i]
		pub := sp.p
		var cb *crcBody
		if !sp.crcKnown && sp.sd.crc != "" && pub.Body != nil {
			// Not in memory (a file): its CRC-32C is taken as the store
			// reads it, in the pass that hashes it.
			cb = &crcBody{rs: pub.Body}
			pub.Body = cb
		}
		resp, err := p.s.store.Publish(ctx, p.rec.Topic, pub)
		if cb != nil {
			sp.crc, sp.crcKnown = cb.sum(sp.p.Size)
		}
		if err != nil {
			// A failed publish may still have written the object (a
			// cancelled call, a lost answer): its path was chosen before,
			// so it goes too.
			if sp.path != "" {
				p.published = append(p.published, sp.path)
			}
			p.Abort(ctx)
			return false, fmt.Errorf("topic %s: offloading the %s (%d bytes): %w", p.rec.Topic, sp.sd.name, sp.p.Size, err)
		}
		p.published = append(p.published, resp.FullPayloadPath)
		if sp.p.Unhashed {
			// The store hashed the payload as it wrote it: the digest
			// header comes from what it wrote (same length as any other
			// digest: the record's size does not change).
			if resp.SHA256 == ([sha256.Size]byte{}) {
				p.Abort(ctx)
				return false, fmt.Errorf("topic %s: offloading the %s: the %s store returned no SHA-256 for a payload it was to hash (call it through payloadstore.Wrap)", p.rec.Topic, sp.sd.name, p.s.store.Class())
			}
			sp.p.SHA256, sp.p.Unhashed = resp.SHA256, false
			if err := sp.apply(p.rec, resp.FullPayloadPath, resp.CustomMetadata, p.s.store.Class()); err != nil {
				p.Abort(ctx)
				return false, err
			}
			if resp.FullPayloadPath != sp.path || len(resp.CustomMetadata) > 0 {
				changed = true
			}
		} else if resp.FullPayloadPath != sp.path || len(resp.CustomMetadata) > 0 {
			if err := sp.apply(p.rec, resp.FullPayloadPath, resp.CustomMetadata, p.s.store.Class()); err != nil {
				p.Abort(ctx)
				return false, err
			}
			changed = true
		}
	}
	return changed, nil
}

// commitChecked commits and, when the store changed the record, measures it
// again against l (undoing the plan if it no longer fits).
func (p *Plan) commitChecked(ctx context.Context, l Limits) error {
	changed, err := p.Commit(ctx)
	if err != nil || !changed {
		return err
	}
	if fits, err := p.s.codec.Fits(l, p.rec.Key, p.rec.Value, p.rec.Headers); err != nil || !fits {
		p.Abort(ctx)
		if err == nil {
			err = p.s.tooLarge(p.rec, l)
		}
		return err
	}
	return nil
}

// Abort deletes what Commit published, except objects named by content
// id, which other records may reference. The deletes go on when ctx ends
// (a client gone away), until the payloadstore.UndoBound ctx carries stops
// (payloadstore.Undo). Delete errors are ignored (counted in the bound
// once it stopped): the objects are then unreferenced and gc's or a TTL's
// to remove.
func (p *Plan) Abort(ctx context.Context) {
	ctx = payloadstore.Undo(ctx)
	for _, path := range p.published {
		if !payloadstore.IsContentID(path) {
			if err := p.s.store.Delete(ctx, path); err != nil {
				payloadstore.UndoFailed(ctx)
			}
		}
	}
	p.published = nil
	for _, rb := range p.rebinds[:p.rebound] {
		if err := rb.Undo(ctx, p.s.store); err != nil {
			payloadstore.UndoFailed(ctx)
		}
	}
	p.rebound = 0
}

// Confirm is called after the broker acknowledged the plan's record: it
// makes sure every object the record references is at its key
// (payloadstore.Confirm), so that a ferry gc run that quarantined or deleted
// one while the acknowledgement was on its way cannot leave the record
// unreadable. An object gc moved to its quarantine is copied back; one it
// deleted is published again from the plan's payload (same id, same key),
// or re-bound again from its source (a copy; a touched object cannot be).
// It returns how many objects it brought back. Errors: ErrPayloadLost
// (wrapping ErrPayloadNotFound) when one cannot be, naming the topic and
// path, and the store's errors. The plan holds its payloads (the record's
// own bytes, not a copy) until Confirm returns.
func (p *Plan) Confirm(ctx context.Context) (int, error) {
	n := 0
	check := func(path string, want *payloadstore.Digest, again func(context.Context) error) error {
		c, err := payloadstore.Confirm(ctx, p.s.store, path, want, again)
		if err != nil {
			return fmt.Errorf("topic %s: the record was acknowledged but its payload %s is gone: %w", p.rec.Topic, path, err)
		}
		if c != payloadstore.Present {
			n++
			slog.Warn("a payload was quarantined or deleted by ferry gc before its record's acknowledgement arrived; brought back",
				"topic", p.rec.Topic, "path", path, "how", c.String())
		}
		return nil
	}
	for i, path := range p.published {
		var again func(context.Context) error
		var want *payloadstore.Digest
		if i < len(p.sides) {
			sp := p.sides[i]
			want = &payloadstore.Digest{Size: sp.p.Size, SHA256: sp.p.SHA256}
			again = func(ctx context.Context) error {
				// The bytes must still be the payload's (a caller's
				// buffer reused since would publish something else).
				if _, err := sp.p.Body.Seek(0, io.SeekStart); err != nil {
					return err
				}
				h := sha256.New()
				if n, err := io.Copy(h, sp.p.Body); err != nil || n != sp.p.Size || [sha256.Size]byte(h.Sum(nil)) != sp.p.SHA256 {
					return fmt.Errorf("%w (the %s's bytes were changed since: %d of %d bytes read, %v)", payloadstore.ErrPayloadLost, sp.sd.name, n, sp.p.Size, err)
				}
				if _, err := sp.p.Body.Seek(0, io.SeekStart); err != nil {
					return err
				}
				resp, err := p.s.store.Publish(ctx, p.rec.Topic, sp.p)
				if err != nil {
					return err
				}
				if resp.FullPayloadPath != path {
					return fmt.Errorf("the store published it at %s", resp.FullPayloadPath)
				}
				return nil
			}
		}
		if err := check(path, want, again); err != nil {
			return n, err
		}
	}
	for _, rb := range p.rebinds[:p.rebound] {
		var again func(context.Context) error
		if rb.Src != rb.Dst {
			again = func(ctx context.Context) error { return rb.Do(ctx, p.s.store) }
		}
		if err := check(rb.Path, nil, again); err != nil {
			return n, err
		}
	}
	return n, nil
}

// Published returns the full paths Commit wrote.
func (p *Plan) Published() []string { return p.published }

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
	keyRef, valueRef, rebinds, err := s.adopt(ctx, rec)
	if err != nil {
		return false, false, err
	}
	for _, r := range rebinds {
		if err := r.Do(ctx, s.store); err != nil {
			return false, false, fmt.Errorf("topic %s: re-binding a reference: %w", rec.Topic, err)
		}
	}
	return keyRef, valueRef, nil
}

// adopt is Adopt without I/O: the copies and touches come back to be done.
func (s *Serializer) adopt(ctx context.Context, rec *kgo.Record) (keyRef, valueRef bool, rebinds []payloadstore.Rebinding, err error) {
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
		rb, err := s.rebind(rec.Topic, ref.FullPayloadPath)
		if err != nil {
			return false, false, nil, fmt.Errorf("topic %s: the record's %s is a reference: %w", rec.Topic, sd.name, err)
		}
		if s.verifyRefs {
			if err := s.verifyReference(ctx, rec, sd, ref.FullPayloadPath); err != nil {
				return false, false, nil, err
			}
		}
		rebinds = append(rebinds, rb)
		if rb.Path != ref.FullPayloadPath {
			ref.FullPayloadPath = rb.Path
			if *b, err = ref.AppendTo(nil); err != nil {
				return false, false, nil, fmt.Errorf("topic %s: %w", rec.Topic, err)
			}
		}
		if sd.name == "key" {
			keyRef = true
		} else {
			valueRef = true
		}
	}
	return keyRef, valueRef, rebinds, nil
}

// rebind applies Adopt's rules to one reference.
func (s *Serializer) rebind(topic, path string) (payloadstore.Rebinding, error) {
	if s.store == nil {
		return payloadstore.Rebinding{}, ErrNoPayloadStore
	}
	kp, err := payloadstore.ReferenceKey(s.store, path)
	if err != nil {
		return payloadstore.Rebinding{}, err
	}
	if kp.Topic != topic && (s.copyTopics == nil || !s.copyTopics.MatchString(kp.Topic)) {
		return payloadstore.Rebinding{}, fmt.Errorf("%w: %s (%s allows copying from other topics)", payloadstore.ErrWrongTopic, kp.Topic, KeyReferenceCopyTopics)
	}
	return payloadstore.PlanCopyToTopic(s.store, path, topic)
}

// OffloadValue publishes p as rec's value whatever its size and sets rec's
// value and headers to the reference. It is the streaming form of Offload
// for payloads that are not in memory (a file, a spooled stdin). With
// payloadstore.StreamPayload the file is read once: the store hashes it as
// it writes it, and the digest header (and Offloaded.ValueSHA256) come from
// that.
func (s *Serializer) OffloadValue(ctx context.Context, rec *kgo.Record, p payloadstore.Payload) (Offloaded, error) {
	var did Offloaded
	err := s.offloadSide(ctx, rec, valueSide, p, &did)
	return did, err
}

// PreviewValue returns a copy of rec with its value replaced by the
// reference and headers OffloadValue would give it for p (whose SHA256 and
// Size are set), without publishing anything, so that a record that could
// not fit even offloaded is refused before its payload is uploaded. It
// returns nil when the path cannot be known in advance (a store without
// ObjectStore). Custom metadata a store adds on publishing (KIP-917) is not
// in the preview. Errors: no store, an invalid path.
func (s *Serializer) PreviewValue(rec *kgo.Record, p payloadstore.Payload) (*kgo.Record, error) {
	if s.store == nil {
		return nil, fmt.Errorf("topic %s: the value (%d bytes) must be offloaded: %w", rec.Topic, p.Size, ErrNoPayloadStore)
	}
	if err := needTopic(rec, valueSide); err != nil {
		return nil, err
	}
	root := s.root()
	if root == "" {
		return nil, nil
	}
	p.ID = s.store.ID(p)
	key, err := payloadstore.ObjectKey(rec.Topic, p.ID)
	if err != nil {
		return nil, fmt.Errorf("topic %s: %w", rec.Topic, err)
	}
	out := cloneRecord(rec)
	// The CRC header as a placeholder of its final length (its value is
	// taken while publishing), so that the preview has the record's size.
	if err := (sidePlan{sd: valueSide, p: p, crcKnown: true}).apply(out, root.Path(key), nil, s.storeClass()); err != nil {
		return nil, err
	}
	return out, nil
}

// ErrNoPayloadStore: a record must be offloaded but no payload store is
// configured (large.message.payload.store.url).
var ErrNoPayloadStore = errors.New("no payload store is configured (large.message.payload.store.url)")

// ErrNoTopic: a record to offload has no topic, so its payload has no
// folder. A Serializer takes the record's Topic as it is; Producer first
// gives a record without one the client's kgo.DefaultProduceTopic.
var ErrNoTopic = errors.New("the record has no topic (set Record.Topic, or kgo.DefaultProduceTopic on the Producer's client)")

// needTopic fails with ErrNoTopic when rec has no topic to name the folder
// of the payload of its side sd.
func needTopic(rec *kgo.Record, sd side) error {
	if rec.Topic == "" {
		return fmt.Errorf("the %s must be offloaded: %w", sd.name, ErrNoTopic)
	}
	return nil
}

func (s *Serializer) offloadSide(ctx context.Context, rec *kgo.Record, sd side, p payloadstore.Payload, did *Offloaded) error {
	if s.store == nil {
		return fmt.Errorf("topic %s: the %s (%d bytes) must be offloaded: %w", rec.Topic, sd.name, p.Size, ErrNoPayloadStore)
	}
	if err := needTopic(rec, sd); err != nil {
		return err
	}
	pl := &Plan{s: s, rec: rec, sides: []sidePlan{{sd: sd, p: p}}}
	if _, err := pl.Commit(ctx); err != nil {
		return err
	}
	did.Key, did.Value = did.Key || sd == keySide, did.Value || sd == valueSide
	did.StoredBytes += p.Size
	if sd == valueSide {
		did.ValueSHA256 = pl.sides[0].p.SHA256
	}
	return nil
}

// offloadAll offloads rec's value (then its key, if the record still does
// not fit l) whatever their size: the recovery of a record the broker
// refused as too large. Nothing is published when the record cannot fit.
func (s *Serializer) offloadAll(ctx context.Context, rec *kgo.Record, l Limits) (*Plan, error) {
	p, err := s.PlanValue(ctx, rec, l)
	if err != nil || p == nil {
		return nil, err
	}
	if err := p.commitChecked(ctx, l); err != nil {
		return nil, err
	}
	return p, nil
}

// Record returns the record the plan rewrites.
func (p *Plan) Record() *kgo.Record { return p.rec }

// bytesPayload is payloadstore.BytesPayload over b with b's CRC-32C, both
// digests taken in one pass over b (a block at a time, while it is in the
// CPU's cache).
func bytesPayload(b []byte) (payloadstore.Payload, uint32) {
	h := sha256.New()
	var crc uint32
	for rest := b; len(rest) > 0; {
		n := min(len(rest), 64<<10)
		h.Write(rest[:n])
		crc = crc32c.Update(crc, rest[:n])
		rest = rest[n:]
	}
	p := payloadstore.Payload{Body: bytes.NewReader(b), Size: int64(len(b))}
	h.Sum(p.SHA256[:0])
	return p, crc
}

// crcBody takes the CRC-32C of a payload's body as a store reads it from
// offset 0 (a retry seeks back to 0 and starts again).
type crcBody struct {
	rs     io.ReadSeeker
	crc    uint32
	n      int64
	broken bool // read from elsewhere than offset 0
}

func (c *crcBody) Read(p []byte) (int, error) {
	n, err := c.rs.Read(p)
	c.crc = crc32c.Update(c.crc, p[:n])
	c.n += int64(n)
	return n, err
}

func (c *crcBody) Seek(off int64, whence int) (int64, error) {
	at, err := c.rs.Seek(off, whence)
	c.crc, c.n, c.broken = 0, 0, err != nil || at != 0
	return at, err
}

// sum returns the CRC of the last pass when it read exactly size bytes.
func (c *crcBody) sum(size int64) (uint32, bool) {
	if c.broken || c.n != size {
		return 0, false
	}
	return c.crc, true
}
