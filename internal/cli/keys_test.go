package cli

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/proxy"
)

// No property of Kafka's Java clients (nor a common librdkafka one) is
// taken for a misspelling of a key ferry reads: those stay warnings.
func TestKafkaKeysAreNotTypos(t *testing.T) {
	f, err := os.Open("testdata/kafka-client-keys.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		k := strings.TrimSpace(sc.Text())
		if k == "" || strings.HasPrefix(k, "#") {
			continue
		}
		n++
		for name, known := range map[string][]string{"produce/consume/gc": clientKeys(), "proxy interceptors": interceptorKeys(),
			"proxy": proxy.ConfigKeys()} {
			if slices.Contains(known, k) {
				continue
			}
			if err := misspelledKey(k, known); err != nil {
				t.Errorf("%s: Kafka's %s is taken for a typo: %v", name, k, err)
			}
		}
		// ferry proxy -X, with and without interceptors: a warning.
		for _, ic := range []bool{false, true} {
			if _, _, err := proxyProperties(map[string]string{k: "1"}, ic); err != nil && !slices.Contains(interceptorKeys(), k) && !slices.Contains(proxy.ConfigKeys(), k) {
				t.Errorf("ferry proxy -X %s (interceptors %v): %v", k, ic, err)
			}
		}
	}
	if n < 150 {
		t.Fatalf("read %d keys", n)
	}
}

// Misspellings of ferry's keys, one or two edits away, are caught, in
// either list.
func TestMisspelledKeys(t *testing.T) {
	for _, c := range []struct{ key, want string }{
		{"large.mesage.threshold.bytes", "large.message.threshold.bytes"},
		{"large.message.treshold.bytes", "large.message.threshold.bytes"},
		{"lrage.message.payload.store.url", "large.message.payload.store.url"},
		{"bootstrap.server", "bootstrap.servers"},
		{"compresion.type", "compression.type"},
		{"client.di", "client.id"},
		{"max.requets.size", "max.request.size"},
	} {
		err := misspelledKey(c.key, clientKeys())
		if err == nil || !strings.Contains(err.Error(), "did you mean "+c.want+"?") {
			t.Errorf("%s: %v, want a usage error suggesting %s", c.key, err, c.want)
		}
	}
	if err := misspelledKey("validate.json.schema.flie", interceptorKeys()); err == nil {
		t.Error("proxy: validate.json.schema.flie not taken for a typo")
	}
	// ferry proxy -X: a key in an interceptor's namespace that none reads
	// is a typo too, however far from the key meant.
	for k, want := range map[string]string{
		"validate.json.schema.path": "the validate.json.* keys are validate.json.schema, validate.json.schema.file",
		"encrypt.key.urls":          "did you mean encrypt.key.url?",
		"redact.field.names":        "the redact.* keys are",
	} {
		_, _, err := proxyProperties(map[string]string{k: "x"}, true)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ferry proxy -X %s: %v, want an error saying %q", k, err, want)
		}
	}
	for _, k := range []string{"linger.ms", "acks", "my.own.setting", "security.protocol"} {
		if err := misspelledKey(k, clientKeys()); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
}

// The command refuses a misspelled key before it does anything (exit 2,
// one line naming the key meant), from -X and from --config alike, and
// goes on past a Kafka client key it has no use for, with a warning.
func TestMisspelledKeyIsAnError(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	in, _ := randomFile(t, dir, "in.bin", 1000, 1)
	r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", "-X", "large.mesage.threshold.bytes=100", in)
	if r.code != ExitUsage || r.stdout != "" {
		t.Errorf("exit %d, stdout %q", r.code, r.stdout)
	}
	oneErrorLine(t, r, "unknown property large.mesage.threshold.bytes (did you mean large.message.threshold.bytes?)")

	cfg := dir + "/client.properties"
	if err := os.WriteFile(cfg, []byte("bootstrap.servers="+brokers+"\nlarge.message.payload.store.ulr=file:///tmp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = run(t, nil, "consume", "--config", cfg, "--topic", "t", "-n", "1")
	if r.code != ExitUsage {
		t.Errorf("consume --config: exit %d", r.code)
	}
	oneErrorLine(t, r, "unknown property large.message.payload.store.ulr (did you mean large.message.payload.store.url?)")

	r = run(t, nil, "produce", "--brokers", brokers, "--topic", "t", "-X", "linger.ms=5", in)
	if r.code != 0 || r.stdout != "t/0@0 1000 bytes inline\n" || !strings.Contains(r.stderr, "key=linger.ms") {
		t.Errorf("produce -X linger.ms=5: exit %d, stdout %q, stderr %q; want it produced with a warning", r.code, r.stdout, r.stderr)
	}
}

// ferry proxy's -X keys for its interceptors get the same check.
func TestProxyMisspelledInterceptorKey(t *testing.T) {
	r := run(t, nil, "proxy", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--interceptors", "redact", "-X", "redact.feilds=password")
	if r.code != ExitUsage {
		t.Errorf("exit %d", r.code)
	}
	oneErrorLine(t, r, "unknown property redact.feilds (did you mean redact.fields?)")
}
