package integration

// The wasm interceptor's done-when tests (issue 20) through a real `ferry
// proxy` process: example modules built from source (internal/wasmtest),
// records produced and consumed by kcat, Kafka's Java console tools and
// Python (confluent-kafka), the stored bytes read straight from the broker.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferrykit/ferry/internal/wasmtest"
	"github.com/ferrykit/ferry/largemessage"
)

// copyModule copies the built module at src into a fresh file the test
// may overwrite.
func copyModule(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// waitMetric polls the proxy's /metrics until sample reaches want (2 min).
func waitMetric(t *testing.T, admin, sample string, want float64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for proxyMetrics(t, admin)[sample] < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach %v within 2 min", sample, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hello produces "hello" with kcat through via and checks that the broker
// stores "HELLO" and kcat reads "HELLO" back through via.
func hello(t *testing.T, via, topic, key string, n int) {
	t.Helper()
	kcatProduce(t, via, topic, []clientRecord{{Key: []byte(key), Value: []byte("hello " + key)}}, nil)
	stored := consumeRaw(t, topic, n)
	if got := string(stored[n-1].Value); got != "HELLO "+strings.ToUpper(key) {
		t.Fatalf("the broker stores %q, want %q", got, "HELLO "+strings.ToUpper(key))
	}
	var got string
	for _, r := range kcatConsume(t, via, topic) {
		if string(r.Key) == key {
			got = string(r.Value)
		}
	}
	if got != "HELLO "+strings.ToUpper(key) {
		t.Fatalf("kcat through the proxy reads %q", got)
	}
}

// Issue 20's first done-when: examples/wasm/uppercase built with the
// documented command, loaded from proxy.yaml and from flags; kcat's
// "hello" is stored and read back as "HELLO"; the module file replaced by
// garbage and SIGHUP: the reload is refused (logged, counted) and the old
// module keeps upper-casing.
func TestWasmProxyUppercase(t *testing.T) {
	kcatPath(t)
	bin := buildFerry(t)
	mod := copyModule(t, wasmtest.Go(t, "examples/wasm/uppercase"))

	t.Run("config", func(t *testing.T) {
		topic := clientTopic(t, 1, nil)
		cfg := filepath.Join(t.TempDir(), "proxy.yaml")
		yaml := fmt.Sprintf("upstream: %s\nlisten: 127.0.0.1:0\nadmin.listen: 127.0.0.1:0\n"+
			"interceptors: [{name: wasm, config: {topic.pattern: \".*\", wasm.module.path: %q}}]\n", brokers(t), mod)
		if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startFerryProc(t, bin, "proxy", "--config", cfg)
		via, admin := proxyAddrs(t, p)
		hello(t, via, topic, "one", 1)

		if err := os.WriteFile(mod, []byte("\x00asm garbage, not a module"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitMetric(t, admin, `ferry_proxy_config_reloads_total{result="failure"}`, 1)
		hello(t, via, topic, "two", 2) // the old module still runs

		p.interrupt(t, os.Interrupt)
		logs := p.stderr.String()
		if !strings.Contains(logs, "config reload refused") || !strings.Contains(logs, mod) {
			t.Fatalf("the refused reload is not logged with the module's path:\n%s", tail([]byte(logs)))
		}
	})

	t.Run("flags", func(t *testing.T) {
		mod := copyModule(t, wasmtest.Go(t, "examples/wasm/uppercase"))
		topic := clientTopic(t, 1, nil)
		p := startFerryProc(t, bin, "proxy", "--upstream", brokers(t), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
			"--interceptors", "wasm", "-X", "wasm.module.path="+mod)
		via, _ := proxyAddrs(t, p)
		hello(t, via, topic, "three", 1)
	})
}

// Issue 20's third done-when: kcat, Kafka's Java console tools and Python
// produce and consume through the chain [wasm (examples/wasm/tagger),
// large-message], records larger than the topic's max.message.bytes
// included (offloaded to the store): each client reads back what it
// produced, byte for byte, plus the header the module set, and the broker
// holds the large values as references.
func TestWasmProxyClientsLargeMessage(t *testing.T) {
	kcatPath(t)
	kafkaToolsCP(t)
	pythonPath(t)
	bin := buildFerry(t)
	mod := wasmtest.Go(t, "examples/wasm/tagger")
	storeURL := interceptorStoreURL(t)
	const maxMessage = 100_000
	limit := fmt.Sprint(maxMessage)
	topic := clientTopic(t, 2, map[string]*string{"max.message.bytes": &limit})
	yaml := fmt.Sprintf(`upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
interceptors:
  - name: wasm
    config:
      topic.pattern: %q
      wasm.module.path: %q
      wasm.config.tag.header: route
      wasm.config.tag.value: eu-west
  - name: large-message
    config:
      topic.pattern: %q
      %s: %q
`, brokers(t), topic, mod, topic, largemessage.KeyStoreURL, storeURL)
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startFerryProc(t, bin, "proxy", "--config", cfg)
	via, _ := proxyAddrs(t, p)

	// Each client's records: small ones and two over max.message.bytes,
	// printable (the console tools are line based), keys unique.
	records := func(client string, seed uint64, header []clientHeader) []clientRecord {
		var rs []clientRecord
		for i, size := range []int{1, 100, 5000, 3 * maxMessage, maxMessage + 1} {
			rs = append(rs, clientRecord{Key: []byte(fmt.Sprintf("%s-%d", client, i)), Value: printable(seed+uint64(i), size), Headers: header})
		}
		return rs
	}
	tagged := func(rs []clientRecord) []clientRecord {
		out := make([]clientRecord, len(rs))
		for i, r := range rs {
			r.Headers = append(append([]clientHeader(nil), r.Headers...), clientHeader{Key: "route", Value: []byte("eu-west")})
			out[i] = r
		}
		return out
	}
	kh := []clientHeader{{Key: "client", Value: []byte("kcat")}}
	kcatRecs := records("kcat", 100, kh)
	kcatProduce(t, via, topic, kcatRecs, kh)
	javaRecs := records("java", 200, []clientHeader{{Key: "client", Value: []byte("java")}})
	javaProduce(t, via, topic, javaRecs)
	pyRecs := records("python", 300, []clientHeader{{Key: "client", Value: []byte("python")}})
	pyProduce(t, via, topic, pyRecs)

	all := tagged(append(append(append([]clientRecord(nil), kcatRecs...), javaRecs...), pyRecs...))
	sameRecords(t, "kcat consume", kcatConsume(t, via, topic), all)
	sameRecords(t, "java console consumer", javaConsume(t, via, topic, len(all)), all)
	sameRecords(t, "python consume", pyConsume(t, via, topic), all)

	// The broker holds the values over max.message.bytes as references.
	offloaded := 0
	for _, r := range consumeRaw(t, topic, len(all)) {
		if len(r.Value) > maxMessage {
			t.Fatalf("the broker holds a value of %d bytes under %q", len(r.Value), r.Key)
		}
		if strings.HasSuffix(string(r.Key), "-3") || strings.HasSuffix(string(r.Key), "-4") {
			offloaded++
			if len(r.Value) >= maxMessage {
				t.Fatalf("%s: not offloaded (%d bytes)", r.Key, len(r.Value))
			}
		}
	}
	if offloaded != 6 {
		t.Fatalf("%d large records at the broker, want 6", offloaded)
	}
}
