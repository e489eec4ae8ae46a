package payloadstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/blob/memblob"
)

// A ranged download holds at most dlConcurrency parts, whatever the
// object's size and however slowly it is read: with a reader that reads
// nothing yet, the fetches stop once every buffer is taken; then the bytes
// come back whole and in order.
func TestRangedDownloadBoundedParts(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	const part, conc = minDownloadPartBytes, 3
	data := make([]byte, 10*part+123)
	rand.Read(data)
	if err := b.WriteAll(ctx, "orders/00/x", data, nil); err != nil {
		t.Fatal(err)
	}
	s := &BlobStore{bucket: b, root: "mem://bounded", dlPart: part, dlConcurrency: conc}
	rc, err := s.download(ctx, "orders/00/x", "mem://bounded/orders/00/x")
	if err != nil {
		t.Fatal(err)
	}
	rr, ok := rc.(*rangedReader)
	if !ok {
		t.Fatalf("a %d-byte object with %d-byte parts is read by %T, want *rangedReader", len(data), part, rc)
	}
	deadline := time.Now().Add(time.Minute)
	for len(rr.parts) < conc {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute %d parts queued, want %d", len(rr.parts), conc)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Every buffer is taken; no further part may start.
	time.Sleep(50 * time.Millisecond)
	if n, free := len(rr.parts), len(rr.slots); n != conc || free != 0 {
		t.Fatalf("%d parts queued and %d buffers free before any read, want %d and 0", n, free, conc)
	}
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (%v), want the %d written", len(got), err, len(data))
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
}

// Close in the middle stops the fetches and returns; a Read after it fails.
func TestRangedDownloadCloseEarly(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	data := make([]byte, 20*minDownloadPartBytes)
	if err := b.WriteAll(ctx, "k", data, nil); err != nil {
		t.Fatal(err)
	}
	s := &BlobStore{bucket: b, root: "mem://x", dlPart: minDownloadPartBytes, dlConcurrency: 4}
	rc, err := s.download(ctx, "k", "mem://x/k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, minDownloadPartBytes+1)); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if n, err := rc.Read(make([]byte, 10)); n != 0 || err == nil {
		t.Fatalf("Read after Close: %d, %v; want an error", n, err)
	}
}

// With a budget, a ranged download charges its buffers to it and gives
// them back at Close: with room for two buffers it runs with two; with no
// room it reads the object as one stream; the bytes are the same.
func TestRangedDownloadBudget(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	const part = minDownloadPartBytes
	data := make([]byte, 7*part+5)
	rand.Read(data)
	if err := b.WriteAll(ctx, "k", data, nil); err != nil {
		t.Fatal(err)
	}
	for _, room := range []int64{2 * part, part / 2, 0} {
		var left, peakUsed atomic.Int64
		left.Store(room)
		budget := Budget{
			Take: func(n int64) bool {
				if left.Add(-n) < 0 {
					left.Add(n)
					return false
				}
				peakUsed.Store(max(peakUsed.Load(), room-left.Load()))
				return true
			},
			Give: func(n int64) { left.Add(n) },
		}
		s := &BlobStore{bucket: b, root: "mem://x", dlPart: part, dlConcurrency: 4, budget: budget}
		rc, err := s.download(ctx, "k", "mem://x/k")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("room %d: read %d bytes (%v), want the %d written", room, len(got), err, len(data))
		}
		rc.Close()
		if left.Load() != room || peakUsed.Load() > room {
			t.Fatalf("room %d: %d left after Close, peak use %d", room, left.Load(), peakUsed.Load())
		}
	}
}

// A download whose ranges have all been started gives each buffer back to
// the budget as soon as Read has used it, not at Close: a streamed value's
// download is closed only once the rest of its response has been written,
// and its buffers must not outlive their charge meanwhile (the proxy's
// fetchers bench went 300 MiB past its bound so); and it takes none before
// its first Read. At the limit: the budget has room for exactly the
// download's parts; none is taken before the first Read, all of it once
// every range has started, all of it is back once the object is read,
// before Close, and no buffer is still referenced after Close.
func TestRangedDownloadGivesBackAsRead(t *testing.T) {
	const part, conc = minDownloadPartBytes, 4
	ctx := WithStreaming(context.Background(), conc*part)
	b := memblob.OpenBucket(nil)
	defer b.Close()
	data := make([]byte, conc*part)
	rand.Read(data)
	if err := b.WriteAll(ctx, "k", data, nil); err != nil {
		t.Fatal(err)
	}
	const room = conc * part
	var left atomic.Int64
	left.Store(room)
	budget := Budget{
		Take: func(n int64) bool {
			if left.Add(-n) < 0 {
				left.Add(n)
				return false
			}
			return true
		},
		Give: func(n int64) { left.Add(n) },
	}
	s := &BlobStore{bucket: b, root: "mem://x", dlPart: DefaultDownloadPartBytes, dlConcurrency: DefaultDownloadConcurrency, budget: budget}
	rc, err := s.download(ctx, "k", "mem://x/k")
	if err != nil {
		t.Fatal(err)
	}
	rr, ok := rc.(*rangedReader)
	if !ok || rr.part != part {
		t.Fatalf("a streamed %d-byte download is read by %T, want *rangedReader with %d-byte parts", len(data), rc, part)
	}
	// Opened, not read: no buffer is taken (a response's later values
	// wait for the ones before them).
	time.Sleep(50 * time.Millisecond)
	if got := left.Load(); got != room || rr.scheduled.Load() {
		t.Fatalf("opened, not read: %d bytes of the budget left (want %d), ranges started %v", got, room, rr.scheduled.Load())
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(rc, first); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !rr.scheduled.Load() {
		if time.Now().After(deadline) {
			t.Fatal("after a minute not every range was started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := left.Load(); got != 0 {
		t.Fatalf("every range started: %d bytes of the budget left, want 0 (each buffer charged)", got)
	}
	rest, err := io.ReadAll(rc)
	got := append(first, rest...)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (%v), want the %d written", len(got), err, len(data))
	}
	if got := left.Load(); got != room {
		t.Fatalf("object read, not closed: %d bytes of the budget left, want all %d back", got, room)
	}
	for range len(rr.slots) {
		buf := <-rr.slots
		if buf != nil {
			t.Fatalf("object read: a buffer of %d bytes is still held", cap(buf))
		}
		rr.slots <- buf
	}
	rc.Close()
	if got := left.Load(); got != room {
		t.Fatalf("after Close: %d bytes of the budget left, want %d", got, room)
	}
	if rr.cur != nil || len(rr.slots) != 0 {
		t.Fatal("after Close the reader still references its buffers")
	}
}
