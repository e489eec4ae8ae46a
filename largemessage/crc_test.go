package largemessage_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSerializerWritesPayloadCRC32C: every way a value is offloaded
// (bytes in memory, a stream the store hashes, a stream already hashed)
// carries ferry.payload.crc32c, the CRC-32C of the payload; a key carries
// none; the Deserializer removes it with the other headers.
func TestSerializerWritesPayloadCRC32C(t *testing.T) {
	ctx := context.Background()
	fs, err := payloadstore.NewFileStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	store := payloadstore.Wrap(fs, payloadstore.DefaultPolicy)
	rng := rand.New(rand.NewPCG(7, 8))
	value := make([]byte, 3<<20+17)
	for i := range value {
		value[i] = byte(rng.Uint32())
	}
	want := fmt.Sprintf("%08x", crc32.Checksum(value, crc32.MakeTable(crc32.Castagnoli)))
	ser := largemessage.NewSerializer(store, largemessage.Codec{Type: "none"})
	check := func(name string, rec *kgo.Record) {
		t.Helper()
		got, ok := largemessage.PayloadCRC32C(rec)
		if !ok || fmt.Sprintf("%08x", got) != want {
			t.Errorf("%s: ferry.payload.crc32c %08x (present %v), want %s", name, got, ok, want)
		}
		for _, h := range rec.Headers {
			if h.Key == "ferry.key.payload.crc32c" {
				t.Errorf("%s: a key CRC header", name)
			}
		}
		de := largemessage.NewDeserializer(store, false)
		if err := de.Resolve(ctx, rec); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(rec.Value, value) || len(rec.Headers) != 0 {
			t.Errorf("%s: resolved to %d bytes, headers %v", name, len(rec.Value), rec.Headers)
		}
	}

	rec := &kgo.Record{Topic: "t", Key: bytes.Repeat([]byte("k"), 2<<20), Value: value}
	if _, err := ser.Offload(ctx, rec, largemessage.DeriveLimits(0, 1<<20, 0)); err != nil {
		t.Fatal(err)
	}
	if !largemessage.IsKeyOffloaded(rec) {
		t.Fatal("the 2 MiB key was not offloaded")
	}
	if err := largemessage.NewDeserializer(store, false).ResolveKey(ctx, rec); err != nil {
		t.Fatal(err)
	}
	check("Offload", rec)

	rec = &kgo.Record{Topic: "t"}
	if _, err := ser.OffloadValue(ctx, rec, payloadstore.StreamPayload(bytes.NewReader(value), int64(len(value)))); err != nil {
		t.Fatal(err)
	}
	check("OffloadValue(StreamPayload)", rec)

	rec = &kgo.Record{Topic: "t"}
	if _, err := ser.OffloadValue(ctx, rec, payloadstore.BytesPayload(value)); err != nil {
		t.Fatal(err)
	}
	check("OffloadValue(BytesPayload)", rec)
}
