package interceptor

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/ferrykit/ferry/payloadstore"
)

// The payload cache's bytes count in the memory budget but never make work
// wait: a charge that finds no room drops cached payloads first. InUse
// leaves the cache out; Reclaimable shows it.
func TestPayloadCacheYieldsToCharges(t *testing.T) {
	mem := NewMemory(10 << 20)
	s, err := payloadstore.Open(context.Background(), "mem://cache-yields", payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := payloadstore.Cached(s, payloadstore.CacheOptions{MaxBytes: 8 << 20, Take: mem.takeReclaimable, Give: mem.giveReclaimable}).(*payloadstore.CachedStore)
	defer c.Close()
	remove := mem.addReclaimer(c.Reclaim)
	defer remove()
	var paths []string
	var datas [][]byte
	for i := range 3 {
		d := make([]byte, 2<<20)
		d[0] = byte(i)
		resp, err := payloadstore.PublishBytes(context.Background(), c, "orders", d)
		if err != nil {
			t.Fatal(err)
		}
		paths, datas = append(paths, resp.FullPayloadPath), append(datas, d)
	}
	for i := range paths {
		sum := sha256.Sum256(datas[i])
		ctx := payloadstore.WithExpected(context.Background(), int64(len(datas[i])), sum[:])
		if _, err := payloadstore.DownloadBytes(ctx, c, paths[i]); err != nil {
			t.Fatal(err)
		}
	}
	if mem.Reclaimable() != 6<<20 || mem.InUse() != 0 {
		t.Fatalf("after three 2 MiB payloads: reclaimable %d, in use %d; want 6 MiB and 0", mem.Reclaimable(), mem.InUse())
	}
	// 7 MiB of work: only 4 MiB are free, so cached payloads go, at once.
	l := &ledger{mem: mem, wait: time.Nanosecond}
	if err := l.charge(context.Background(), 7<<20); err != nil {
		t.Fatalf("a charge the cache's bytes stood in the way of: %v", err)
	}
	if mem.InUse() != 7<<20 || mem.Reclaimable() > 3<<20 {
		t.Fatalf("in use %d, reclaimable %d; want 7 MiB and at most 3 MiB", mem.InUse(), mem.Reclaimable())
	}
	l.release()
	if mem.InUse() != 0 {
		t.Fatalf("%d bytes in use after release", mem.InUse())
	}
	// A frame's unqueued take of the whole budget reclaims the rest.
	sum := sha256.Sum256(datas[0])
	if _, err := payloadstore.DownloadBytes(payloadstore.WithExpected(context.Background(), 2<<20, sum[:]), c, paths[0]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := mem.TakeUnqueued(ctx, 10<<20); err != nil || mem.Reclaimable() != 0 {
		t.Fatalf("taking the whole budget with payloads cached: %v, reclaimable %d", err, mem.Reclaimable())
	}
	mem.Give(10 << 20)
	if err := mem.TakeUnqueued(ctx, 1<<20); err != nil || mem.InUse() != 1<<20 {
		t.Fatalf("an unqueued take of 1 MiB with room: %v, %d in use", err, mem.InUse())
	}
	mem.Give(1 << 20)
}
