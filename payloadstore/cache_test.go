package payloadstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrykit/ferry/payloadstore"
)

// countingStore counts the downloads that reach the store under a cache;
// gate, when set, holds each download until it is closed.
type countingStore struct {
	payloadstore.PayloadStore
	downloads atomic.Int64
	gate      chan struct{}
}

func (c *countingStore) Download(ctx context.Context, p string) (io.ReadCloser, error) {
	c.downloads.Add(1)
	if c.gate != nil {
		<-c.gate
	}
	return c.PayloadStore.Download(ctx, p)
}

var cacheSeq atomic.Int64

func cachedMem(t *testing.T, o payloadstore.CacheOptions) (*countingStore, *payloadstore.CachedStore) {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), fmt.Sprintf("mem://cache-%d", cacheSeq.Add(1)), payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{PayloadStore: s}
	c := payloadstore.Cached(cs, o).(*payloadstore.CachedStore)
	t.Cleanup(func() { c.Close() })
	return cs, c
}

func readExpected(t *testing.T, s payloadstore.PayloadStore, path string, data []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(data)
	ctx := payloadstore.WithExpected(context.Background(), int64(len(data)), sum[:])
	b, err := payloadstore.DownloadBytes(ctx, s, path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Several readers of one payload at once make one download, and later
// readers none; every reader gets the exact bytes.
func TestCacheConcurrentMissesShareOneDownload(t *testing.T) {
	cs, c := cachedMem(t, payloadstore.CacheOptions{MaxBytes: 8 << 20})
	data := randPayload(t, 3<<20)
	resp, err := payloadstore.PublishBytes(context.Background(), c, "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	cs.gate = make(chan struct{})
	var wg sync.WaitGroup
	bad := atomic.Int64{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !bytes.Equal(readExpected(t, c, resp.FullPayloadPath, data), data) {
				bad.Add(1)
			}
		}()
	}
	close(cs.gate)
	wg.Wait()
	readExpected(t, c, resp.FullPayloadPath, data)
	if n := cs.downloads.Load(); n != 1 || bad.Load() != 0 {
		t.Fatalf("9 readers made %d downloads (%d got other bytes), want 1; stats %+v", n, bad.Load(), c.Stats())
	}
	if st := c.Stats(); st.Entries != 1 || st.Bytes != int64(len(data)) || st.Fills != 1 {
		t.Fatalf("stats %+v, want one entry of %d bytes", st, len(data))
	}
}

// Bytes that do not match the expected digest or size are never kept: each
// reader reads the object itself (and its own check reports the mismatch).
func TestCacheKeepsOnlyVerifiedPayloads(t *testing.T) {
	cs, c := cachedMem(t, payloadstore.CacheOptions{MaxBytes: 8 << 20})
	data := randPayload(t, 1<<20)
	resp, err := payloadstore.PublishBytes(context.Background(), c, "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	other := append([]byte(nil), data...)
	other[0] ^= 1
	for _, want := range [][]byte{other, data[:len(data)-1], append(append([]byte(nil), data...), 0)} {
		sum := sha256.Sum256(want)
		ctx := payloadstore.WithExpected(context.Background(), int64(len(want)), sum[:])
		got, err := payloadstore.DownloadBytes(ctx, c, resp.FullPayloadPath)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("download expecting other bytes: %d bytes, %v; want the object's own bytes", len(got), err)
		}
	}
	if st := c.Stats(); st.Entries != 0 || st.Bytes != 0 {
		t.Fatalf("unverified bytes kept: %+v", st)
	}
	if n := cs.downloads.Load(); n != 6 {
		t.Fatalf("%d downloads, want 6 (a fill and the reader's own, three times)", n)
	}
	// Without an expectation the cache is not used.
	if _, err := payloadstore.DownloadBytes(context.Background(), c, resp.FullPayloadPath); err != nil || c.Stats().Entries != 0 {
		t.Fatalf("download without an expectation: %v, stats %+v", err, c.Stats())
	}
}

// At the limit: entries that fill the bound exactly stay; one more drops
// the least recently used; a payload over the bound is never cached; the
// budget's bytes come back when entries go, and a budget with no room
// leaves the payload uncached.
func TestCacheBoundAndBudget(t *testing.T) {
	var budget atomic.Int64
	budget.Store(3 << 20)
	take := func(n int64) bool {
		if budget.Add(-n) < 0 {
			budget.Add(n)
			return false
		}
		return true
	}
	give := func(n int64) { budget.Add(n) }
	cs, c := cachedMem(t, payloadstore.CacheOptions{MaxBytes: 2 << 20, Take: take, Give: give})
	var paths []string
	var datas [][]byte
	for range 3 {
		d := randPayload(t, 1<<20)
		resp, err := payloadstore.PublishBytes(context.Background(), c, "orders", d)
		if err != nil {
			t.Fatal(err)
		}
		paths, datas = append(paths, resp.FullPayloadPath), append(datas, d)
	}
	readExpected(t, c, paths[0], datas[0])
	readExpected(t, c, paths[1], datas[1])
	if st := c.Stats(); st.Bytes != 2<<20 || st.Entries != 2 || budget.Load() != 1<<20 {
		t.Fatalf("two 1 MiB entries in a 2 MiB cache: %+v, budget left %d", st, budget.Load())
	}
	readExpected(t, c, paths[0], datas[0]) // paths[1] is now the least recently used
	readExpected(t, c, paths[2], datas[2])
	before := cs.downloads.Load()
	readExpected(t, c, paths[0], datas[0])
	readExpected(t, c, paths[2], datas[2])
	if cs.downloads.Load() != before {
		t.Fatalf("the two most recent payloads were downloaded again")
	}
	readExpected(t, c, paths[1], datas[1])
	if cs.downloads.Load() != before+1 {
		t.Fatalf("the evicted payload was not downloaded again")
	}
	if st := c.Stats(); st.Bytes > 2<<20 {
		t.Fatalf("cache holds %d bytes, over its bound of %d", st.Bytes, 2<<20)
	}
	big := randPayload(t, 2<<20+1)
	resp, err := payloadstore.PublishBytes(context.Background(), c, "orders", big)
	if err != nil {
		t.Fatal(err)
	}
	readExpected(t, c, resp.FullPayloadPath, big)
	if st := c.Stats(); st.Bypassed == 0 || st.Bytes > 2<<20 {
		t.Fatalf("a payload over the bound: stats %+v", st)
	}
	if freed := c.Reclaim(1); freed != 1<<20 || budget.Load() != 2<<20 {
		t.Fatalf("Reclaim(1) freed %d, budget %d; want one entry (1 MiB) back", freed, budget.Load())
	}
	budget.Store(0) // the budget is full elsewhere
	c.Reclaim(1 << 30)
	budget.Store(0)
	readExpected(t, c, paths[1], datas[1])
	if st := c.Stats(); st.Entries != 0 {
		t.Fatalf("a payload cached with no room in the budget: %+v", st)
	}
}

// Fills of different payloads at once stay within the bound: each made
// room before the others had added their entries, so the last to finish
// must drop what the others added.
func TestCacheConcurrentFillsStayWithinBound(t *testing.T) {
	cs, c := cachedMem(t, payloadstore.CacheOptions{MaxBytes: 2 << 20})
	var paths []string
	var datas [][]byte
	for range 4 {
		d := randPayload(t, 1<<20)
		resp, err := payloadstore.PublishBytes(context.Background(), c, "orders", d)
		if err != nil {
			t.Fatal(err)
		}
		paths, datas = append(paths, resp.FullPayloadPath), append(datas, d)
	}
	cs.gate = make(chan struct{})
	var wg sync.WaitGroup
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readExpected(t, c, paths[i], datas[i])
		}()
	}
	for cs.downloads.Load() < int64(len(paths)) {
		runtime.Gosched()
	}
	close(cs.gate)
	wg.Wait()
	if st := c.Stats(); st.Bytes > 2<<20 {
		t.Fatalf("four 1 MiB payloads filled at once: the cache holds %d bytes in %d entries, over its bound of %d", st.Bytes, st.Entries, 2<<20)
	}
}
