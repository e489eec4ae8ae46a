package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrykit/ferry/internal/cli"
	"github.com/ferrykit/ferry/largemessage"
)

// `ferry produce` then `ferry consume` move a 100 MiB file through the real
// broker at default limits with identical bytes, and Kafka holds only the
// reference record.
func TestCLIProduceConsume100MiB(t *testing.T) {
	b := brokers(t)
	topic := newTopic(t, nil)
	dir := t.TempDir()
	store := "file://" + filepath.Join(dir, "store")
	src := filepath.Join(dir, "payload.bin")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.NewChaCha8([32]byte{100}), 100<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := h.Sum(nil)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	if code := cli.Run(ctx, []string{"produce", "--brokers", b, "--topic", topic, "--store", store, src}, &out, &errb); code != 0 {
		t.Fatalf("ferry produce exited %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "offloaded") {
		t.Fatalf("produce output: %q", out.String())
	}

	raw := consumeRaw(t, topic, 1)
	if len(raw[0].Value) > 1024 || !largemessage.IsOffloaded(raw[0]) {
		t.Fatalf("kafka holds a %d-byte value (offloaded=%v), want only the reference", len(raw[0].Value), largemessage.IsOffloaded(raw[0]))
	}

	outDir := filepath.Join(dir, "out")
	out.Reset()
	errb.Reset()
	if code := cli.Run(ctx, []string{"consume", "--brokers", b, "--topic", topic, "--store", store, "--out", outDir, "-n", "1"}, &out, &errb); code != 0 {
		t.Fatalf("ferry consume exited %d: %s", code, errb.String())
	}
	got, err := os.ReadFile(filepath.Join(outDir, "payload.bin")) // the name produce sent
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(got); len(got) != 100<<20 || !bytes.Equal(sum[:], want) {
		t.Fatalf("consumed %d bytes, digest match %v", len(got), bytes.Equal(sum[:], want))
	}
}
