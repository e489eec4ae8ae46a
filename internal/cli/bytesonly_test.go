package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
