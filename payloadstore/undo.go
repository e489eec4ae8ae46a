package payloadstore

import (
	"context"
	"sync/atomic"
	"time"
)

// UndoBound ends the undoing of work no acknowledged record references
// (the deletes of the payloads of a refused or abandoned request) when the
// process must stop: such deletes outlive the request that made them (a
// client gone away does not stop them: Undo), so without a bound a store
// that hangs holds them up to its own timeout, retries included
// (large.message.payload.store.timeout.ms). ferry proxy carries one in
// every connection's context and stops it when Shutdown's
// shutdown.timeout.ms runs out. A payload whose delete was cut short is
// referenced by nothing: ferry gc removes it.
type UndoBound struct {
	ctx    context.Context
	cancel context.CancelFunc
	left   atomic.Int64
}

// NewUndoBound returns a bound that has not stopped.
func NewUndoBound() *UndoBound {
	b := &UndoBound{}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

type undoBoundKey struct{}

// With returns ctx carrying b: Undo of ctx, or of any context derived from
// it (context.WithoutCancel keeps it too), ends when b stops.
func (b *UndoBound) With(ctx context.Context) context.Context {
	return context.WithValue(ctx, undoBoundKey{}, b)
}

// Stop ends every undo under b: their store calls return with
// context.Canceled, and the deletes that fail from now on count in Left.
func (b *UndoBound) Stop() { b.cancel() }

// Left is how many deletes under b failed after it stopped (UndoFailed):
// objects left in the store, referenced by nothing.
func (b *UndoBound) Left() int64 { return b.left.Load() }

// Undo returns the context in which to undo work begun under ctx (delete
// what a request published that will never be acknowledged): ctx's values
// without its cancellation or deadline, as context.WithoutCancel, so that
// a client gone away leaves nothing behind; when ctx carries an UndoBound
// (With), the returned context ends when that bound stops.
func Undo(ctx context.Context) context.Context {
	detached := context.WithoutCancel(ctx)
	if b, ok := ctx.Value(undoBoundKey{}).(*UndoBound); ok && b != nil {
		return undoContext{Context: detached, stop: b.ctx}
	}
	return detached
}

// UndoFailed notes that a delete made in Undo(ctx) failed: when ctx's
// bound has stopped, the object is counted as left (UndoBound.Left).
func UndoFailed(ctx context.Context) {
	if b, ok := ctx.Value(undoBoundKey{}).(*UndoBound); ok && b != nil && b.ctx.Err() != nil {
		b.left.Add(1)
	}
}

// undoContext has the values of Context (detached from its cancellation)
// and ends with stop. No goroutine or registration is made for it: a
// context derived from it (a store's timeout) watches stop's channel.
type undoContext struct {
	context.Context // context.WithoutCancel: no deadline, never done
	stop            context.Context
}

func (u undoContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (u undoContext) Done() <-chan struct{}       { return u.stop.Done() }
func (u undoContext) Err() error                  { return u.stop.Err() }
