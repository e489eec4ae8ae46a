package largemessage_test

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrykit/ferry/envelope"
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
// MB/s counts the payload once per direction; write-MB/s and read-MB/s
// are each direction alone (1 GiB over its own time); peak-heap-MiB is the
// largest Go heap in use during the run.
func BenchmarkFileStore1GiB(b *testing.B) {
	benchFileStore1GiB(b, func(dir string) payloadstore.PayloadStore {
		store, err := payloadstore.NewFileStore(dir, nil)
		if err != nil {
			b.Fatal(err)
		}
		return payloadstore.Wrap(store, payloadstore.DefaultPolicy)
	})
}

// BenchmarkEncryptedFileStore1GiB is BenchmarkFileStore1GiB with payload
// encryption on: the store is opened from the configuration keys
// large.message.payload.store.url (the file store) and
// large.message.payload.encryption.key.url (a fresh base64key:// key, so
// no KMS; the data key is made once and cached), as a producer configures
// it, so every payload is sealed as it is written (payloadstore.Encrypted:
// Tink's streaming AES256-GCM-HKDF, 256 KiB segments) and opened segment by
// segment as it is read. Same payload, same metrics (MB/s counts the
// plaintext); scripts/bench encrypted runs both and prints the ratio.
func BenchmarkEncryptedFileStore1GiB(b *testing.B) {
	key := make([]byte, 32)
	if _, err := crand.Read(key); err != nil {
		b.Fatal(err)
	}
	benchFileStore1GiB(b, func(dir string) payloadstore.PayloadStore {
		cfg, err := largemessage.ParseConfig(map[string]string{
			largemessage.KeyStoreURL:         "file://" + dir,
			largemessage.KeyEncryptionKeyURL: "base64key://" + base64.URLEncoding.EncodeToString(key),
		})
		if err != nil {
			b.Fatal(err)
		}
		store, err := cfg.OpenStore(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if !payloadstore.IsEncrypted(store) {
			b.Fatal("the store opened with an encryption key does not encrypt")
		}
		return store
	})
}

// benchFileStore1GiB runs one of the 1 GiB benchmarks over the store open
// returns for a folder (closed at the end).
func benchFileStore1GiB(b *testing.B, open func(dir string) payloadstore.PayloadStore) {
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
	wrapped := open(filepath.Join(dir, "store"))
	defer wrapped.Close()
	encrypted := payloadstore.IsEncrypted(wrapped)
	ser := largemessage.NewSerializer(wrapped, largemessage.Codec{Type: "none"})
	de := largemessage.NewDeserializer(wrapped, false)
	ctx := context.Background()
	var writeSecs, readSecs float64
	runtime.GC()
	stop := peakHeap()
	b.SetBytes(2 * size)
	b.ResetTimer()
	for b.Loop() {
		p := payloadstore.StreamPayload(f, size)
		rec := &kgo.Record{Topic: "bench"}
		start := time.Now()
		if _, err := ser.OffloadValue(ctx, rec, p); err != nil {
			b.Fatal(err)
		}
		written := time.Now()
		writeSecs += written.Sub(start).Seconds()
		ref, _ := largemessage.DecodeReference(rec.Value)
		if sealed := sealedObject(b, ref.FullPayloadPath); sealed != encrypted {
			b.Fatalf("object %s: sealed %v, want %v", ref.FullPayloadPath, sealed, encrypted)
		}
		rc, _, err := de.OpenValue(ctx, rec)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := ctxio.Copy(ctx, io.Discard, rc); err != nil || n != size {
			b.Fatalf("read %d: %v", n, err)
		}
		rc.Close()
		readSecs += time.Since(written).Seconds()
		wrapped.Delete(ctx, ref.FullPayloadPath)
	}
	b.StopTimer()
	b.ReportMetric(float64(stop())/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(b.N)*size/1e6/writeSecs, "write-MB/s")
	b.ReportMetric(float64(b.N)*size/1e6/readSecs, "read-MB/s")
	f.Close()
}

// sealedObject reports whether the file store's object at fullPath
// (file://...) starts with the envelope's magic: the benchmark checks it
// measures what it names.
func sealedObject(b *testing.B, fullPath string) bool {
	obj, err := os.Open(strings.TrimPrefix(fullPath, "file://"))
	if err != nil {
		b.Fatal(err)
	}
	defer obj.Close()
	head := make([]byte, len(envelope.Magic))
	if _, err := io.ReadFull(obj, head); err != nil {
		b.Fatal(err)
	}
	return envelope.IsSealed(head)
}
