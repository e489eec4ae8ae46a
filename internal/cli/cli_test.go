package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// runResult is one ferry invocation's outcome.
type runResult struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func run(t *testing.T, stdin io.Reader, args ...string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	start := time.Now()
	code := RunIO(ctx, args, stdin, &out, &errb)
	r := runResult{code: code, stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	t.Logf("ferry %s -> exit %d in %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
	return r
}

// newCluster starts an in-process Kafka with Kafka's default
// message.max.bytes and a one-partition topic "t".
func newCluster(t *testing.T) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "1048588"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return strings.Join(c.ListenAddrs(), ",")
}

func randomFile(t *testing.T, dir, name string, size int, seed uint64) (string, [32]byte) {
	t.Helper()
	b := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, sha256.Sum256(b)
}

func fileSHA(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// oneErrorLine checks that stderr is exactly one "ferry: " line containing want.
func oneErrorLine(t *testing.T, r runResult, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "ferry: ") || !strings.Contains(lines[0], want) {
		t.Errorf("stderr = %q, want one line \"ferry: ...%s...\"", r.stderr, want)
	}
}

func TestDemo(t *testing.T) {
	dir := t.TempDir()
	big, _ := randomFile(t, dir, "big.bin", 3<<20, 1)
	small, _ := randomFile(t, dir, "small.bin", 10<<10, 2)
	r := run(t, nil, "demo", "--no-machine-files", "--records", "30", "--file", big, "--file", small, "--progress")
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for _, want := range []string{
		"records", "inline", "offloaded", "bytes in Kafka", "bytes in store", "MB/s",
		"boundary-fits (generated)", "OK: all 36 records came back with matching SHA-256",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 2 && f[0] == "small" && f[1] != "30":
			t.Errorf("small row %q: want 30 records", l)
		case len(f) > 2 && f[0] == "total" && (f[1] != "36" || f[2] != "32" || f[3] != "4"):
			t.Errorf("total row %q: want 36 records, 32 inline, 4 offloaded", l)
		case strings.HasPrefix(l, big):
			if f[len(f)-2] != "yes" || f[len(f)-1] != "yes" {
				t.Errorf("big file line %q: want offloaded yes, match yes", l)
			}
		case strings.HasPrefix(l, small):
			if f[len(f)-2] != "no" || f[len(f)-1] != "yes" {
				t.Errorf("small file line %q: want offloaded no, match yes", l)
			}
		case strings.HasPrefix(l, "boundary-fits"):
			if f[len(f)-2] != "no" {
				t.Errorf("%q: the largest inline value was offloaded", l)
			}
		case strings.HasPrefix(l, "boundary-over"):
			if f[len(f)-2] != "yes" {
				t.Errorf("%q: one byte over the limit was not offloaded", l)
			}
		}
	}
	if !strings.Contains(r.stderr, "uploading") { // one pass: hashed as it is uploaded
		t.Errorf("--progress drew no bar on stderr")
	}
}

func TestProduceConsumeRoundTrip(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	store := "file://" + filepath.Join(dir, "store")
	big, bigSum := randomFile(t, dir, "big.bin", 5<<20, 3)
	small, smallSum := randomFile(t, dir, "small.txt", 3000, 4)

	r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", "--store", store, big, small)
	if r.code != 0 {
		t.Fatalf("produce: exit %d", r.code)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "t/0@0 5242880 bytes offloaded "+store+"/t/") ||
		lines[1] != "t/0@1 3000 bytes inline" {
		t.Fatalf("produce output %q", r.stdout)
	}

	// Standard input: a small one stays in memory, a large one is spooled.
	stdinBig := bytes.Repeat([]byte("0123456789abcdef"), (2<<20)/16+7)
	r = run(t, bytes.NewReader(stdinBig), "produce", "--brokers", brokers, "--topic", "t", "--store", store, "--progress", "-")
	if r.code != 0 || !strings.HasPrefix(r.stdout, fmt.Sprintf("t/0@2 %d bytes offloaded ", len(stdinBig))) {
		t.Fatalf("produce - (large): exit %d, %q", r.code, r.stdout)
	}
	r = run(t, strings.NewReader("hello"), "produce", "--brokers", brokers, "--topic", "t", "--key", "k", "-")
	if r.code != 0 || r.stdout != "t/0@3 5 bytes inline\n" {
		t.Fatalf("produce - (small, no store): exit %d, %q", r.code, r.stdout)
	}

	out := filepath.Join(dir, "out")
	r = run(t, nil, "consume", "--brokers", brokers, "--topic", "t", "--store", store, "--out", out, "-n", "4")
	if r.code != 0 {
		t.Fatalf("consume: exit %d", r.code)
	}
	if got := fileSHA(t, filepath.Join(out, "big.bin")); got != bigSum {
		t.Errorf("5 MiB file: SHA-256 %x, want %x", got, bigSum)
	}
	if got := fileSHA(t, filepath.Join(out, "small.txt")); got != smallSum {
		t.Errorf("small file: SHA-256 %x, want %x", got, smallSum)
	}
	if got := fileSHA(t, filepath.Join(out, "t-0-2")); got != sha256.Sum256(stdinBig) {
		t.Errorf("spooled stdin: SHA-256 differs")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "t-0-3")); string(b) != "hello" {
		t.Errorf("small stdin: %q", b)
	}
	if !strings.Contains(r.stdout, "t/0@0 5242880 bytes offloaded key=\"big.bin\" -> "+filepath.Join(out, "big.bin")) {
		t.Errorf("consume output %q", r.stdout)
	}

	// To standard output, stopping when idle.
	r = run(t, nil, "consume", "--brokers", brokers, "--topic", "t", "--store", store, "--timeout", "700ms")
	if r.code != 0 {
		t.Fatalf("consume to stdout: exit %d", r.code)
	}
	want := string(mustRead(t, big)) + string(mustRead(t, small)) + string(stdinBig) + "hello"
	if r.stdout != want {
		t.Errorf("stdout: %d bytes, want %d", len(r.stdout), len(want))
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// With compression and a larger max.request.size, a 4 MiB compressible file
// is decided by exact sizing: it compresses under the threshold and goes inline.
func TestProduceCompressedInline(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "text")
	content := bytes.Repeat([]byte("ferry carries large messages across kafka\n"), (4<<20)/42)
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", "-X", "compression.type=zstd", "-X", "max.request.size=10000000", p)
	if r.code != 0 || r.stdout != fmt.Sprintf("t/0@0 %d bytes inline\n", len(content)) {
		t.Fatalf("exit %d, %q", r.code, r.stdout)
	}
	out := filepath.Join(dir, "out")
	r = run(t, nil, "consume", "--brokers", brokers, "--topic", "t", "--out", out, "-n", "1")
	if r.code != 0 || fileSHA(t, filepath.Join(out, "text")) != sha256.Sum256(content) {
		t.Fatalf("consume: exit %d", r.code)
	}
}

func TestProduceNeedsStoreOnlyForLargeRecords(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	small, _ := randomFile(t, dir, "small", 1000, 5)
	big, _ := randomFile(t, dir, "big", 2<<20, 6)
	r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", small)
	if r.code != 0 || r.stdout != "t/0@0 1000 bytes inline\n" {
		t.Fatalf("small without store: exit %d %q", r.code, r.stdout)
	}
	r = run(t, nil, "produce", "--brokers", brokers, "--topic", "t", small, big)
	if r.code != 2 || r.stdout != "" {
		t.Fatalf("large without store: exit %d, stdout %q (want 2, a configuration error; nothing produced)", r.code, r.stdout)
	}
	oneErrorLine(t, r, "must be offloaded, but no payload store is set: use --store")

	r = run(t, bytes.NewReader(make([]byte, 2<<20)), "produce", "--brokers", brokers, "--topic", "t", "-")
	if r.code != 2 {
		t.Fatalf("large stdin without store: exit %d, want 2", r.code)
	}
	oneErrorLine(t, r, "standard input (more than 999947 bytes)")

	// Refused before anything reaches the cluster: a missing topic is
	// not created for a file that could never be produced to it.
	r = run(t, nil, "produce", "--brokers", brokers, "--topic", "fresh", big)
	if r.code != 2 {
		t.Fatalf("large without store to a missing topic: exit %d, want 2", r.code)
	}
	oneErrorLine(t, r, "must be offloaded, but no payload store is set")
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if topics.Has("fresh") {
		t.Fatalf("topic fresh was created for a file refused before producing (topics %v)", topics.Names())
	}
}

func TestConsumeMissingPayload(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	big, _ := randomFile(t, dir, "big", 2<<20, 7)
	small, smallSum := randomFile(t, dir, "small", 100, 8)
	r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", "--store", storeDir, big, small)
	if r.code != 0 {
		t.Fatalf("produce: exit %d", r.code)
	}
	// Remove the payload, as a store TTL would.
	objs, _ := filepath.Glob(filepath.Join(storeDir, "t", "*", "*")) // <topic>/<shard>/<id>
	if len(objs) != 1 {
		t.Fatalf("store objects %v", objs)
	}
	os.Remove(objs[0])

	out := filepath.Join(dir, "out")
	r = run(t, nil, "consume", "--brokers", brokers, "--topic", "t", "--store", storeDir, "--out", out, "-n", "2")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1", r.code)
	}
	oneErrorLine(t, r, "topic t partition 0 offset 0: value: payload store download")
	if !strings.Contains(r.stderr, "payload not found") {
		t.Errorf("stderr %q does not say the payload is missing", r.stderr)
	}

	r = run(t, nil, "consume", "--brokers", brokers, "--topic", "t", "--store", storeDir, "--out", out, "-n", "2",
		"-X", "large.message.skip.not.found.error=true")
	if r.code != 0 {
		t.Fatalf("with skip: exit %d", r.code)
	}
	if !strings.Contains(r.stderr, "skipped") {
		t.Errorf("no warning for the skipped record: %q", r.stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "big")); err == nil {
		t.Errorf("a file was written for the skipped record")
	}
	if fileSHA(t, filepath.Join(out, "small")) != smallSum {
		t.Errorf("record after the skipped one differs")
	}
}

func TestUsageAndConnectionErrors(t *testing.T) {
	dir := t.TempDir()
	f, _ := randomFile(t, dir, "f", 10, 9)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing topic", []string{"produce", "--brokers", "127.0.0.1:1", f}, 2, "produce: --topic is required"},
		{"missing brokers", []string{"produce", "--topic", "t", f}, 2, "--brokers (or the property bootstrap.servers) is required"},
		{"no file", []string{"produce", "--brokers", "127.0.0.1:1", "--topic", "t"}, 2, "produce: name at least one FILE, or - for standard input"},
		{"missing file", []string{"produce", "--brokers", "127.0.0.1:1", "--topic", "t", filepath.Join(dir, "nope")}, 2, "no such file"},
		{"unknown flag", []string{"produce", "--bogus"}, 2, "unknown flag: --bogus"},
		{"unknown command", []string{"fly"}, 2, `unknown command "fly"`},
		{"bad -X", []string{"-X", "oops", "consume", "--brokers", "127.0.0.1:1", "--topic", "t"}, 2, `-X "oops": expected key=value`},
		{"missing config", []string{"--config", filepath.Join(dir, "none.properties"), "consume", "--brokers", "127.0.0.1:1", "--topic", "t"}, 2, "does not exist"},
		{"bad property", []string{"-X", "large.message.threshold.bytes=lots", "consume", "--brokers", "127.0.0.1:1", "--topic", "t"}, 2, "large.message.threshold.bytes"},
		{"bad log level", []string{"--log-level", "loud", "demo"}, 2, "--log-level"},
		{"ssl key without SSL", []string{"-X", "ssl.ca.location=/etc/ca.pem", "consume", "--brokers", "127.0.0.1:1", "--topic", "t"}, 2, "ssl.ca.location: set, but security.protocol is PLAINTEXT"},
		{"GSSAPI", []string{"-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=GSSAPI", "gc", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", dir}, 2, "GSSAPI (Kerberos) is not supported"},
		{"misspelled security.protocol", []string{"-X", "securty.protocol=SASL_SSL", "produce", "--brokers", "127.0.0.1:1", "--topic", "t", f}, 2, "unknown property securty.protocol (did you mean security.protocol?"},
		{"misspelled ssl key", []string{"-X", "security.protocol=SSL", "-X", "ssl.ca.locaton=/etc/ca.pem", "produce", "--brokers", "127.0.0.1:1", "--topic", "t", f}, 2, "unknown property ssl.ca.locaton (did you mean ssl.ca.location?"},
		{"Kafka's class key given a chain", []string{"-X", "value.serializer=avro,large-message", "produce", "--brokers", "127.0.0.1:1", "--topic", "t", f}, 2, "value.serializer names the Java client's class; ferry's chain of stages is value.serializers"},
		{"unknown security.protocol", []string{"-X", "security.protocol=TLS", "produce", "--brokers", "127.0.0.1:1", "--topic", "t", f}, 2, `security.protocol: "TLS": want PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL`},
		{"missing truststore", []string{"-X", "security.protocol=SSL", "-X", "ssl.truststore.location=" + filepath.Join(dir, "nope.p12"), "produce", "--brokers", "127.0.0.1:1", "--topic", "t", f}, 2, "ssl.truststore.location: stat"},
		{"SASL secret not echoed", []string{"-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=PLAIN", "-X", "sasl.username=u", "-X", "sasl.password=TopSecret4", "consume", "--brokers", "127.0.0.1:1", "--topic", "t"}, 1, "cannot reach Kafka at 127.0.0.1:1 (SASL_PLAINTEXT (PLAIN as u)): "},
		{"unreachable broker (produce)", []string{"produce", "--brokers", "127.0.0.1:1", "--topic", "t", f}, 1, "cannot reach Kafka at 127.0.0.1:1: "},
		{"unreachable broker (consume)", []string{"consume", "--brokers", "127.0.0.1:1", "--topic", "t"}, 1, "cannot reach Kafka at 127.0.0.1:1: "},
		{"bad store", []string{"produce", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", "nope://x", f}, 2, `--store "nope://x": not a store URL: unknown scheme "nope"`},
		// Found by review: secrets in a bad store URL are not echoed.
		{"bad store URL with secrets", []string{"produce", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", "s3://AKIAX:TopSecret1@b/%zz?sig=TopSecret2", f}, 2, "malformed URL"},
		{"store URL with credentials", []string{"produce", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", "s3://AKIAX:TopSecret1@b/p?sig=TopSecret2&x-amz-security-token=TopSecret3", f}, 2, "credentials in the URL are not accepted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, nil, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			oneErrorLine(t, r, tc.want)
			if strings.Contains(r.stderr+r.stdout, "TopSecret") {
				t.Errorf("a secret from the command line is echoed: %q", r.stderr)
			}
			if r.took > 5*time.Second {
				t.Errorf("took %s", r.took)
			}
		})
	}
}

func TestMissingTopic(t *testing.T) {
	brokers := newCluster(t)
	r := run(t, nil, "consume", "--brokers", brokers, "--topic", "nope")
	if r.code != 1 {
		t.Errorf("exit %d", r.code)
	}
	oneErrorLine(t, r, "topic nope does not exist")
}

func TestConfigFileSuppliesBrokersAndStore(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	big, sum := randomFile(t, dir, "big", 1500000, 10)
	cfg := filepath.Join(dir, "client.properties")
	content := "bootstrap.servers=" + brokers + "\nlarge.message.payload.store.url=file://" + filepath.Join(dir, "store") + "\nclient.id=ferry-test\n"
	if err := os.WriteFile(cfg, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "--config", cfg, "produce", "--topic", "t", big)
	if r.code != 0 || !strings.Contains(r.stdout, "offloaded file://") {
		t.Fatalf("exit %d %q", r.code, r.stdout)
	}
	out := filepath.Join(dir, "out")
	r = run(t, nil, "--config", cfg, "consume", "--topic", "t", "-o", out, "-n", "1")
	if r.code != 0 || fileSHA(t, filepath.Join(out, "big")) != sum {
		t.Fatalf("exit %d", r.code)
	}
}

func TestHelp(t *testing.T) {
	r := run(t, nil, "consume", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "default 10s") {
		t.Errorf("consume --help: exit %d, documents no default timeout:\n%s", r.code, r.stdout)
	}
}

// A record larger than receive.message.max.bytes (franz-go's
// BrokerMaxReadBytes; a ferry proxy returns resolved records whole, so
// records over 100 MiB through it meet this bound) fails consume with an
// error naming the key; raised, the same record is read. fetch.max.bytes and
// max.partition.fetch.bytes are applied too (receive.message.max.bytes may
// not be below fetch.max.bytes).
func TestCLIConsumeReceiveMaxBytes(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	p, sum := randomFile(t, dir, "rec", 900<<10, 7)
	if r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", p); r.code != 0 {
		t.Fatalf("produce: exit %d", r.code)
	}
	small := []string{"-X", "fetch.max.bytes=65536", "-X", "max.partition.fetch.bytes=65536"}
	r := run(t, nil, append([]string{"consume", "--brokers", brokers, "--topic", "t", "-n", "1", "--timeout", "30s",
		"--out", filepath.Join(dir, "a"), "-X", "receive.message.max.bytes=65536"}, small...)...)
	if r.code == 0 || !strings.Contains(r.stderr, "raise it with -X receive.message.max.bytes=BYTES") {
		t.Fatalf("a 900 KiB record with receive.message.max.bytes=65536: exit %d, want an error naming the key", r.code)
	}
	// franz-go reports it for the whole fetch (topic "", partition -1): the
	// message says so rather than naming an empty topic.
	if !strings.Contains(r.stderr, "fetching from the brokers: ") || strings.Contains(r.stderr, "partition -1") {
		t.Fatalf("the error names no topic as such: %s", r.stderr)
	}
	r = run(t, nil, append([]string{"consume", "--brokers", brokers, "--topic", "t", "-n", "1", "--timeout", "30s",
		"--out", filepath.Join(dir, "b"), "-X", "receive.message.max.bytes=2097152"}, small...)...)
	if r.code != 0 || fileSHA(t, filepath.Join(dir, "b", "rec")) != sum {
		t.Fatalf("receive.message.max.bytes=2097152: exit %d", r.code)
	}
	r = run(t, nil, "consume", "--brokers", brokers, "--topic", "t", "-n", "1", "-X", "receive.message.max.bytes=x")
	if r.code != 2 {
		t.Fatalf("receive.message.max.bytes=x: exit %d, want 2", r.code)
	}
}
