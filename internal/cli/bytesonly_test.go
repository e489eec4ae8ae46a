package cli

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
)

// value.serializers=bytes (a chain without large-message) never offloads
// the value, as the library's Producer does with it and as ferry produce
// does with value.serializers=avro: an input that fits the topic is
// produced inline, one that does not is refused, naming the chain, before
// anything is published, even with --store set, for a file and for
// standard input alike.
func TestProduceBytesChainNeverOffloads(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	small, _ := randomFile(t, dir, "small.bin", 3000, 31)
	big, _ := randomFile(t, dir, "big.bin", 3<<20, 32)

	r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "--store", storeDir,
		"-X", "value.serializers=bytes", small)
	if r.code != 0 || !strings.HasSuffix(strings.TrimSpace(r.stdout), " inline") {
		t.Errorf("small input: exit %d, stdout %q; want 0 and one inline record", r.code, r.stdout)
	}
	bigBytes, err := os.ReadFile(big)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		stdin []byte
		args  []string
	}{
		{"file, with a store", nil, []string{"--store", storeDir, big}},
		{"file, no store", nil, []string{big}},
		{"standard input, with a store", bigBytes, []string{"--store", storeDir, "-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"produce", "--brokers", brokers, "-t", "t", "-X", "value.serializers=bytes"}, tc.args...)
			r := run(t, bytes.NewReader(tc.stdin), args...)
			if r.code == 0 || r.stdout != "" {
				t.Errorf("exit %d, stdout %q; want a failure and nothing produced", r.code, r.stdout)
			}
			oneErrorLine(t, r, "value.serializers bytes has no large-message stage to offload it")
			if strings.Contains(r.stderr, "no payload store is set") {
				t.Errorf("asks for a store although the chain never offloads: %s", r.stderr)
			}
			if objs := storeObjects(t, storeDir); len(objs) != 0 {
				t.Errorf("store objects: %v; want none", objs)
			}
		})
	}
}

// With compression.type set, an input over the client's max.request.size
// is offloaded however well it compresses (the client bounds a record
// before compression, as Java's and franz-go's do): the error for a missing
// store names max.request.size, the limit that decided it, rather than only
// the topic's threshold, which a compressible input would have met.
func TestProduceCompressedOverMaxRequestSizeNamesIt(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(p, bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog\n"), 70000), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "-X", "compression.type=zstd", p)
	if r.code != 2 || r.stdout != "" {
		t.Errorf("exit %d, stdout %q; want 2 and nothing produced", r.code, r.stdout)
	}
	oneErrorLine(t, r, "max.request.size (1000012 bytes")
	oneErrorLine(t, r, "no payload store is set")
}

// consume --out tells a record without a key (standard input, kcat without
// -K) from one whose key is empty: key=null, as kafka-console-consumer
// prints a null key, and key="" for the empty key.
func TestConsumeOutNullKey(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	f, _ := randomFile(t, dir, "f.bin", 100, 33)
	if r := run(t, strings.NewReader("from stdin"), "produce", "--brokers", brokers, "-t", "t", "-"); r.code != 0 {
		t.Fatalf("produce stdin: exit %d", r.code)
	}
	if r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "--key", "", f); r.code != 0 {
		t.Fatalf("produce --key '': exit %d", r.code)
	}
	r := run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--out", filepath.Join(dir, "out"), "-n", "2")
	if r.code != 0 {
		t.Fatalf("consume: exit %d", r.code)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], " key=null -> ") || !strings.Contains(lines[1], ` key="" -> `) {
		t.Errorf("stdout %q: want key=null for the record without a key, then key=\"\" for the empty key", r.stdout)
	}
}

// consume with value.deserializers=bytes (a chain without large-message)
// writes an offloaded value as it was fetched, its PayloadReferenceValue,
// as kafka-console-consumer with the ByteArrayDeserializer shows it, and
// calls it inline; the default chain resolves the payload.
func TestConsumeBytesChainKeepsReference(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	big, sum := randomFile(t, dir, "big.bin", 2<<20, 34)
	if r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "--store", storeDir, big); r.code != 0 || !strings.Contains(r.stdout, " offloaded ") {
		t.Fatalf("produce: exit %d, stdout %q; want one offloaded record", r.code, r.stdout)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		how      string
		resolved bool
	}{
		{"default chain", nil, " offloaded ", true},
		{"value.deserializers=bytes", []string{"-X", "value.deserializers=bytes"}, " inline ", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := append([]string{"consume", "--brokers", brokers, "-t", "t", "--store", storeDir, "--out", out, "-n", "1"}, tc.args...)
			r := run(t, nil, args...)
			if r.code != 0 || !strings.Contains(r.stdout, tc.how) {
				t.Fatalf("exit %d, stdout %q; want 0 and a record written%s", r.code, r.stdout, tc.how)
			}
			got, err := os.ReadFile(filepath.Join(out, "big.bin"))
			if err != nil {
				t.Fatal(err)
			}
			if resolved := sha256.Sum256(got) == sum; resolved != tc.resolved {
				t.Errorf("wrote %d bytes, the payload: %v; want %v", len(got), resolved, tc.resolved)
			}
			if !tc.resolved {
				if _, err := largemessage.DecodeReference(got); err != nil {
					t.Errorf("wrote %d bytes, not the PayloadReferenceValue: %v", len(got), err)
				}
			}
		})
	}
}

// produce, consume, gc and proxy refuse a mem:// store (exit 2, nothing
// produced): it lives in the process, so a record produced with it
// referenced a payload gone when ferry exited (found by a new-user helper:
// produce said offloaded, consume then said payload not found, and kcat
// through a proxy waited at the record for ever).
func TestCLIRefusesMemStore(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	big, _ := randomFile(t, dir, "big.bin", 2<<20, 35)
	for _, args := range [][]string{
		{"produce", "--brokers", brokers, "-t", "t", "--store", "mem://x", big},
		{"produce", "--brokers", brokers, "-t", "t", "-X", "large.message.payload.store.url=mem://x", big},
		{"consume", "--brokers", brokers, "-t", "t", "--store", "mem://x", "-n", "1"},
		{"gc", "--brokers", brokers, "-t", "t", "--store", "mem://x", "--dry-run"},
		{"proxy", "--upstream", brokers, "--listen", "127.0.0.1:0", "--interceptors", "large-message", "--store", "mem://x"},
	} {
		r := run(t, nil, args...)
		if r.code != ExitUsage || r.stdout != "" {
			t.Errorf("%s: exit %d, stdout %q; want %d and nothing done", args[0], r.code, r.stdout, ExitUsage)
		}
		oneErrorLine(t, r, "lives in this process's memory")
	}
}
