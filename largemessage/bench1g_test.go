package largemessage_test

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrykit/ferry/internal/ctxio"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kgo"
)

// peakHeap samples the heap in use every few ms until stop is called and
// returns the largest value seen, in bytes.
func peakHeap() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var ms runtime.MemStats
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); <-finished; return peak.Load() }
}

// BenchmarkFileStore1GiB publishes a 1 GiB file through the serializer's
// streaming path into the file store (one pass: hashed while written to a
// temp file, fsync, rename) and reads it back through the verifying reader
// (size and SHA-256 checked), as ferry consume does (ctxio.Copy).
// MB/s counts the payload once per direction; peak-heap-MiB is the largest
// Go heap in use during the run.
func BenchmarkFileStore1GiB(b *testing.B) {
	const size = 1 << 30
	dir := b.TempDir()
	src := filepath.Join(dir, "payload.bin")
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.NewChaCha8([32]byte{42}), size); err != nil {
		b.Fatal(err)
	}
	store, err := payloadstore.NewFileStore(filepath.Join(dir, "store"), nil)
	if err != nil {
		b.Fatal(err)
	}
	wrapped := payloadstore.Wrap(store, payloadstore.DefaultPolicy)
	ser := largemessage.NewSerializer(wrapped, largemessage.Codec{Type: "none"})
	de := largemessage.NewDeserializer(wrapped, false)
	ctx := context.Background()
	runtime.GC()
	stop := peakHeap()
	b.SetBytes(2 * size)
	b.ResetTimer()
	for b.Loop() {
		p := payloadstore.StreamPayload(f, size)
		rec := &kgo.Record{Topic: "bench"}
		if _, err := ser.OffloadValue(ctx, rec, p); err != nil {
			b.Fatal(err)
		}
		rc, _, err := de.OpenValue(ctx, rec)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := ctxio.Copy(ctx, io.Discard, rc); err != nil || n != size {
			b.Fatalf("read %d: %v", n, err)
		}
		rc.Close()
		ref, _ := largemessage.DecodeReference(rec.Value)
		wrapped.Delete(ctx, ref.FullPayloadPath)
	}
	b.StopTimer()
	b.ReportMetric(float64(stop())/(1<<20), "peak-heap-MiB")
	f.Close()
}
