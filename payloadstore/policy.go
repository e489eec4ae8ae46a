package payloadstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Policy is how Wrap retries a store and bounds its custom metadata. The
// config keys come from KIP-1159 (early revision) and KIP-917.
type Policy struct {
	// Timeout bounds one operation including every retry and backoff
	// (large.message.payload.store.timeout.ms). KIP-1159 requires it to stay
	// within the producer's max.block.ms and the consumer's
	// max.poll.interval.ms; the largemessage config checks that.
	Timeout time.Duration
	// RetryCount is how many times a retryable failure is retried
	// (large.message.payload.store.retry.count); 0 tries once.
	RetryCount int
	// RetryBackoff is the first wait between attempts
	// (large.message.payload.store.retry.backoff.ms); it doubles each retry,
	// with ±20% jitter, up to RetryMaxBackoff
	// (large.message.payload.store.retry.max.backoff.ms).
	RetryBackoff    time.Duration
	RetryMaxBackoff time.Duration
	// CustomMetadataMaxBytes is the most custom metadata a publish may
	// return (large.message.payload.store.custom.metadata.max.bytes, KIP-917,
	// default 128). Over it the publish fails with ErrCustomMetadataTooLarge
	// and the uploaded object is deleted.
	CustomMetadataMaxBytes int
}

// DefaultPolicy holds the defaults of the large.message.payload.store.* keys.
var DefaultPolicy = Policy{
	Timeout:                60 * time.Second,
	RetryCount:             3,
	RetryBackoff:           100 * time.Millisecond,
	RetryMaxBackoff:        1000 * time.Millisecond,
	CustomMetadataMaxBytes: 128,
}

// Wrap returns s with p applied: each Publish, Download (the open) and Delete
// is retried on retryable errors with exponential backoff, the whole of it
// bounded by p.Timeout; a Publish whose custom metadata is too large is
// undone. The error of the last attempt is returned, wrapped with the number
// of attempts.
func Wrap(s PayloadStore, p Policy) PayloadStore {
	if w, ok := s.(*policyStore); ok {
		s = w.PayloadStore
	}
	return &policyStore{PayloadStore: s, p: p}
}

// Unwrap returns the store under a Wrap, or s itself. It also sees
// through a wrapper that only observes (a Wrapper, such as observe.Store),
// so that such a wrapper keeps the one-pass publishing and the listing of
// the store it wraps.
func Unwrap(s PayloadStore) PayloadStore {
	for {
		switch w := s.(type) {
		case *policyStore:
			s = w.PayloadStore
		case Wrapper:
			s = w.UnwrapStore()
		default:
			return s
		}
	}
}

// Wrapper is implemented by a store that wraps another one without
// changing what it does (metrics, tracing): Unwrap follows UnwrapStore.
type Wrapper interface {
	PayloadStore
	UnwrapStore() PayloadStore
}

type policyStore struct {
	PayloadStore
	p Policy
}

func (w *policyStore) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if w.p.Timeout > 0 {
		return context.WithTimeout(ctx, w.p.Timeout)
	}
	return context.WithCancel(ctx)
}

// ErrNoProgress is the cause of a ReadOnce publish ended because its
// body gave no byte for large.message.payload.store.timeout.ms (a client
// that stopped sending mid-value, or a store that stopped taking parts).
var ErrNoProgress = fmt.Errorf("%w: no progress for large.message.payload.store.timeout.ms", context.DeadlineExceeded)

// withProgress bounds a ReadOnce publish by the time between two reads of
// pl's body (whose Body it wraps to see them), rather than by the whole
// call: the returned context ends with ErrNoProgress once the body has
// not been read for the policy's Timeout.
func (w *policyStore) withProgress(ctx context.Context, pl *Payload) (context.Context, context.CancelFunc) {
	if w.p.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	pb := &progressBody{ReadSeeker: pl.Body}
	pb.last.Store(time.Now().UnixNano())
	pl.Body = pb
	stop := make(chan struct{})
	tick := max(w.p.Timeout/8, time.Millisecond)
	go func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case now := <-t.C:
				if now.Sub(time.Unix(0, pb.last.Load())) > w.p.Timeout {
					cancel(ErrNoProgress)
					return
				}
			}
		}
	}()
	return ctx, func() { close(stop); cancel(nil) }
}

// progressBody notes when its body was last read.
type progressBody struct {
	io.ReadSeeker
	last atomic.Int64 // unix nanoseconds
}

func (b *progressBody) Read(p []byte) (int, error) {
	n, err := b.ReadSeeker.Read(p)
	b.last.Store(time.Now().UnixNano())
	return n, err
}

// retry runs op until it succeeds, fails fatally, runs out of attempts or
// ctx ends.
func retry[T any](ctx context.Context, p Policy, op func() (T, error)) (T, error) {
	backoff := p.RetryBackoff
	var zero T
	for attempt := 0; ; attempt++ {
		v, err := op()
		if err == nil {
			return v, nil
		}
		if !IsRetryable(err) || attempt >= p.RetryCount {
			if attempt > 0 {
				err = fmt.Errorf("after %s: %w", attempts(attempt+1), err)
			}
			return zero, err
		}
		wait := backoff
		if wait > 0 {
			wait = time.Duration(float64(wait) * (0.8 + 0.4*rand.Float64()))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return zero, fmt.Errorf("after %s, large.message.payload.store.timeout.ms ran out: %w", attempts(attempt+1), errors.Join(err, ctx.Err()))
			}
			return zero, fmt.Errorf("after %s, cancelled: %w", attempts(attempt+1), ctx.Err())
		case <-t.C:
		}
		backoff *= 2
		if p.RetryMaxBackoff > 0 && backoff > p.RetryMaxBackoff {
			backoff = p.RetryMaxBackoff
		}
	}
}

func (w *policyStore) Publish(ctx context.Context, topic string, pl Payload) (PayloadResponse, error) {
	hs, own := w.PayloadStore.(hashingStore)
	policy := w.p
	var cancel context.CancelFunc
	if pl.ReadOnce {
		if !own || !hs.onePass(pl) {
			return PayloadResponse{}, &Error{Op: "publish", Path: topic,
				Err: fmt.Errorf("%w: the %s store needs the payload's SHA-256 before it writes it (a content id, or a store from outside this package)", ErrNotRewindable, w.Class())}
		}
		// One attempt, bounded by the time between two reads of the
		// body: a payload fed at a client's pace may take longer than
		// the whole-call bound, and a stalled client ends the upload.
		policy.RetryCount = 0
		ctx, cancel = w.withProgress(ctx, &pl)
	} else {
		ctx, cancel = w.withTimeout(ctx)
	}
	defer cancel()
	if pl.Unhashed && !(own && hs.onePass(pl)) {
		// The id or the store needs the digest before the bytes are
		// written: a pass to hash them first.
		var err error
		if pl, err = hashFirst(ctx, pl); err != nil {
			return PayloadResponse{}, &Error{Op: "publish", Path: topic, Err: err}
		}
	}
	if pl.ID == "" {
		// Fix the id once, so that every attempt writes the same object.
		pl.ID = w.PayloadStore.ID(pl)
	}
	// The stores of this package check what they read against the
	// payload's size and digest before the object becomes visible, and
	// return the digest of what they wrote. Of another store, hash what it
	// actually reads here: a Body that changed since its SHA256 was taken
	// (a file rewritten during upload) must not end up referenced under a
	// digest it does not have.
	var hb *hashingBody
	if !own {
		hb = &hashingBody{body: pl.Body, h: sha256.New()}
		pl.Body = hb
	}
	resp, err := retry(ctx, policy, func() (PayloadResponse, error) {
		return w.PayloadStore.Publish(ctx, topic, pl)
	})
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrNoProgress) {
			err = &Error{Op: "publish", Path: topic, Retryable: true, Err: errors.Join(cause, err)}
		}
		return PayloadResponse{}, err
	}
	switch {
	case own && !pl.Unhashed && pl.SHA256 != ([sha256.Size]byte{}) && resp.SHA256 != pl.SHA256:
		// (the store checked this already: a second look costs nothing)
		derr := w.undo(ctx, resp.FullPayloadPath)
		return PayloadResponse{}, &Error{Op: "publish", Path: resp.FullPayloadPath,
			Err: errors.Join(fmt.Errorf("%w: the store wrote %d bytes with SHA-256 %x, the payload was %d bytes with %x", ErrPayloadChanged, pl.Size, resp.SHA256, pl.Size, pl.SHA256), derr)}
	case own:
	default:
		// A store that did not read through Body (a stub, or one that
		// reads the source another way) is not checked here.
		if got := hb.h.Sum(nil); hb.n > 0 && (hb.n != pl.Size || !bytes.Equal(got, pl.SHA256[:])) {
			derr := w.undo(ctx, resp.FullPayloadPath)
			return PayloadResponse{}, &Error{Op: "publish", Path: resp.FullPayloadPath,
				Err: errors.Join(fmt.Errorf("%w: the store read %d bytes with SHA-256 %x, the payload was %d bytes with %x", ErrPayloadChanged, hb.n, got, pl.Size, pl.SHA256), derr)}
		}
		resp.SHA256 = pl.SHA256
	}
	if max := w.p.CustomMetadataMaxBytes; len(resp.CustomMetadata) > max {
		derr := w.undo(ctx, resp.FullPayloadPath)
		return PayloadResponse{}, &Error{Op: "publish", Path: resp.FullPayloadPath,
			Err: errors.Join(fmt.Errorf("%w: %d bytes > %d", ErrCustomMetadataTooLarge, len(resp.CustomMetadata), max), derr)}
	}
	return resp, nil
}

// undo deletes an object just published that must not be referenced, unless
// it is named by content id: then other records may already reference the
// same object, and it stays.
func (w *policyStore) undo(ctx context.Context, fullPath string) error {
	if IsContentID(fullPath) {
		return nil
	}
	return w.Delete(context.WithoutCancel(ctx), fullPath)
}

func (w *policyStore) Download(ctx context.Context, fullPath string) (io.ReadCloser, error) {
	ctx, cancel := w.withTimeout(ctx)
	rc, err := retry(ctx, w.p, func() (io.ReadCloser, error) {
		return w.PayloadStore.Download(ctx, fullPath)
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return &cancelOnClose{ReadCloser: rc, cancel: cancel}, nil
}

func (w *policyStore) Delete(ctx context.Context, fullPath string) error {
	ctx, cancel := w.withTimeout(ctx)
	defer cancel()
	_, err := retry(ctx, w.p, func() (struct{}, error) {
		return struct{}{}, w.PayloadStore.Delete(ctx, fullPath)
	})
	return err
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// hashingBody hashes the bytes a store reads from a payload body; a seek
// back to the start (a retry) starts the hash afresh.
type hashingBody struct {
	body io.ReadSeeker
	h    hash.Hash
	n    int64
}

func (b *hashingBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	return n, err
}

func (b *hashingBody) Seek(off int64, whence int) (int64, error) {
	pos, err := b.body.Seek(off, whence)
	if err == nil && pos == 0 {
		b.h.Reset()
		b.n = 0
	}
	return pos, err
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// objects returns the wrapped store's ObjectStore.
func (w *policyStore) objects() (ObjectStore, error) { return Objects(w.PayloadStore) }

// do runs one ObjectStore call with the policy's retries and time bound.
func (w *policyStore) do(ctx context.Context, op func(ctx context.Context, o ObjectStore) error) error {
	o, err := w.objects()
	if err != nil {
		return err
	}
	ctx, cancel := w.withTimeout(ctx)
	defer cancel()
	_, err = retry(ctx, w.p, func() (struct{}, error) { return struct{}{}, op(ctx, o) })
	return err
}

// Root implements ObjectStore for a wrapped store ("" when it has none).
func (w *policyStore) Root() Root {
	if o, err := w.objects(); err == nil {
		return o.Root()
	}
	return ""
}

func (w *policyStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	var oi ObjectInfo
	err := w.do(ctx, func(ctx context.Context, o ObjectStore) (err error) {
		oi, err = o.Stat(ctx, key)
		return err
	})
	return oi, err
}

func (w *policyStore) Copy(ctx context.Context, src, dst string) error {
	return w.do(ctx, func(ctx context.Context, o ObjectStore) error { return o.Copy(ctx, src, dst) })
}

func (w *policyStore) Touch(ctx context.Context, key string) error {
	return w.do(ctx, func(ctx context.Context, o ObjectStore) error { return o.Touch(ctx, key) })
}

func (w *policyStore) Move(ctx context.Context, src, dst string) error {
	return w.do(ctx, func(ctx context.Context, o ObjectStore) error { return o.Move(ctx, src, dst) })
}

func (w *policyStore) Remove(ctx context.Context, key string) error {
	return w.do(ctx, func(ctx context.Context, o ObjectStore) error { return o.Remove(ctx, key) })
}

// ListKeys is not retried: fn may have seen part of the listing.
func (w *policyStore) ListKeys(ctx context.Context, prefix string, fn func(string, ObjectInfo) error) error {
	o, err := w.objects()
	if err != nil {
		return err
	}
	return o.ListKeys(ctx, prefix, fn)
}

func (w *policyStore) Put(ctx context.Context, key string, b []byte) error {
	return w.do(ctx, func(ctx context.Context, o ObjectStore) error { return o.Put(ctx, key, b) })
}

func (w *policyStore) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	var b []byte
	err := w.do(ctx, func(ctx context.Context, o ObjectStore) (err error) {
		b, err = o.Get(ctx, key, max)
		return err
	})
	return b, err
}
