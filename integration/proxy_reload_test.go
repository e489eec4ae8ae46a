package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// connHooks counts a franz-go client's broker connections and their closes
// (kgo.HookBrokerConnect, kgo.HookBrokerDisconnect).
type connHooks struct{ connects, disconnects atomic.Int64 }

func (h *connHooks) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		h.connects.Add(1)
	}
}
func (h *connHooks) OnBrokerDisconnect(kgo.BrokerMetadata, net.Conn) { h.disconnects.Add(1) }

// reloadRecord is the value the test produces: its phase (the config
// version in force when it was produced) and a field redact masks.
type reloadRecord struct {
	Phase  int    `json:"phase"`
	Seq    int    `json:"seq"`
	Secret string `json:"secret"`
}

// proxyMetrics reads the proxy's /metrics into sample -> value (labels
// included in the sample name, as exposed).
func proxyMetrics(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// The interceptor chain of a running `ferry proxy` process is changed five
// times (one of them a bad config, refused) while a franz-go producer, a
// franz-go consumer, a kcat consumer and a background producer run through
// it. Each phase's records must carry the effect of the config in force
// when they were produced (redact's mask names the phase), and no client
// connection may drop: the clients' own connection hooks and kcat's log
// see no disconnect, and the proxy accepts no new connection after the
// clients are set up.
//
// Race-free by design: the phase producer flushes, the test changes the
// config and waits until /metrics counts the reload attempt (and, for a
// good config, shows its version) before the next phase's records go out.
// The other clients keep requests in flight across every switch.
//
// The config sits in a Kubernetes ConfigMap layout (file -> ..data/file,
// ..data -> a versioned dir); the changes are an in-place write, an
// editor's write-and-rename, a bad config, SIGHUP after a write (with a
// restart-only key changed: a warning), and the ConfigMap symlink swap.
func TestProxyHotReload(t *testing.T) {
	upstream := brokers(t)
	kcat := kcatPath(t)
	bin := buildFerry(t)
	topic := newTopic(t, nil)
	bg := newTopic(t, nil)
	storeDir := t.TempDir()

	mount := t.TempDir()
	writeConfig := func(phase int, extra string) []byte {
		var b strings.Builder
		fmt.Fprintf(&b, "upstream: %s\nlisten: 127.0.0.1:0\nadmin.listen: 127.0.0.1:0\n%s", upstream, extra)
		b.WriteString("interceptors:\n")
		switch phase {
		case 2: // none: records pass as produced (removing redact must be said)
			b.WriteString("  []\nreload.allow.unprotected: true\n")
		case 3: // refused: the phase 2 chain stays
			b.WriteString("  - name: no-such-interceptor\n")
		default:
			fmt.Fprintf(&b, "  - name: redact\n    config:\n      topic.pattern: %q\n      redact.fields: secret\n      redact.mask: m%d\n",
				topic+"|"+bg, phase)
			if phase%2 == 1 { // and a store to open, and to close when the chain retires
				fmt.Fprintf(&b, "  - name: large-message\n    config:\n      topic.pattern: %q\n      large.message.payload.store.url: file://%s\n",
					topic, storeDir)
			}
		}
		return []byte(b.String())
	}
	version := func(raw []byte) string {
		sum := sha256.Sum256(raw)
		return hex.EncodeToString(sum[:8])
	}
	// ConfigMap layout.
	if err := os.Mkdir(filepath.Join(mount, "..v0"), 0o755); err != nil {
		t.Fatal(err)
	}
	raw0 := writeConfig(0, "")
	if err := os.WriteFile(filepath.Join(mount, "..v0", "proxy.yaml"), raw0, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..v0", filepath.Join(mount, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/proxy.yaml", filepath.Join(mount, "proxy.yaml")); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(mount, "proxy.yaml")

	p := startFerryProc(t, bin, "proxy", "--config", config)
	bootstrap, admin := proxyAddrs(t, p)
	if m := proxyMetrics(t, admin); m[`ferry_proxy_config_info{version="`+version(raw0)+`"}`] != 1 || m["ferry_proxy_config_generation"] != 1 {
		t.Fatalf("at start: config_info of %s and generation 1 expected", version(raw0))
	}

	var hooks connHooks
	opts := []kgo.Opt{kgo.SeedBrokers(bootstrap), kgo.WithHooks(&hooks), kgo.ConnIdleTimeout(15 * time.Minute)}
	prod, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	bgProd, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(bg), kgo.ProducerLinger(0))...)
	if err != nil {
		t.Fatal(err)
	}
	defer bgProd.Close()
	cons, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic, bg), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	kc := startMember(t, "kcat", false, kcat, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-u", "-f", "%s\n",
		"-X", "log.connection.close=true")

	// The consumer and the background producer run through every reload.
	const perPhase = 150
	want := map[int]string{0: "m0", 1: "m1", 2: "s", 3: "s", 4: "m4", 5: "m5"} // phase 3 is refused: phase 2's chain
	var (
		mu   sync.Mutex
		got  []reloadRecord
		bgOK atomic.Int64
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var bgErr, consErr atomic.Value
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			fs := cons.PollFetches(ctx)
			fs.EachError(func(t string, p int32, err error) {
				if ctx.Err() == nil {
					consErr.Store(fmt.Sprintf("%s/%d: %v", t, p, err))
				}
			})
			fs.EachRecord(func(r *kgo.Record) {
				if r.Topic != topic {
					return
				}
				var v reloadRecord
				if err := json.Unmarshal(r.Value, &v); err != nil {
					consErr.Store(fmt.Sprintf("record %q: %v", r.Value, err))
					return
				}
				mu.Lock()
				got = append(got, v)
				mu.Unlock()
			})
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			r := &kgo.Record{Value: fmt.Appendf(nil, `{"bg":%d,"secret":"s"}`, i)}
			if err := bgProd.ProduceSync(ctx, r).FirstErr(); err != nil {
				if ctx.Err() == nil {
					bgErr.Store(err.Error())
				}
				return
			}
			bgOK.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()

	produce := func(phase int) {
		t.Helper()
		var failed atomic.Int64
		for i := range perPhase {
			v, _ := json.Marshal(reloadRecord{Phase: phase, Seq: i, Secret: "s"})
			prod.Produce(ctx, &kgo.Record{Value: v}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Add(1)
					t.Errorf("phase %d: produce: %v", phase, err)
				}
			})
			if i%10 == 9 {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if err := prod.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if failed.Load() > 0 {
			t.Fatalf("phase %d: %d records failed", phase, failed.Load())
		}
	}
	// awaitReload waits until /metrics counts attempts reloads and, for a
	// good config, shows its version.
	awaitReload := func(attempts int, raw []byte, good bool) map[string]float64 {
		t.Helper()
		var m map[string]float64
		waitFor(t, time.Minute, func() bool {
			m = proxyMetrics(t, admin)
			n := m[`ferry_proxy_config_reloads_total{result="success"}`] + m[`ferry_proxy_config_reloads_total{result="failure"}`]
			return int(n) >= attempts && (!good || m[`ferry_proxy_config_info{version="`+version(raw)+`"}`] == 1)
		}, func() string {
			return fmt.Sprintf("reload %d not seen on /metrics; stderr:\n%s", attempts, p.stderr.String())
		})
		return m
	}
	realDir := filepath.Join(mount, "..v0")

	produce(0)
	// Warmed up: every client has its connections now.
	waitFor(t, time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= perPhase && bgOK.Load() > 10 },
		func() string { return "the consumer did not see phase 0" })
	waitFor(t, time.Minute, func() bool { return len(kc.Lines()) >= perPhase }, func() string { return "kcat did not see phase 0: " + kc.Stderr() })
	before := proxyMetrics(t, admin)
	connectsBefore := hooks.connects.Load()

	// 1: written in place.
	raw := writeConfig(1, "")
	if err := os.WriteFile(filepath.Join(realDir, "proxy.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	awaitReload(1, raw, true)
	produce(1)
	// 2: an editor's write and rename.
	raw = writeConfig(2, "")
	tmp := filepath.Join(realDir, ".proxy.yaml.swp")
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(realDir, "proxy.yaml")); err != nil {
		t.Fatal(err)
	}
	awaitReload(2, raw, true)
	produce(2)
	// 3: a bad config, refused.
	raw = writeConfig(3, "")
	if err := os.WriteFile(filepath.Join(realDir, "proxy.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	m := awaitReload(3, raw, false)
	if m[`ferry_proxy_config_reloads_total{result="failure"}`] != 1 || m["ferry_proxy_config_generation"] != 3 {
		t.Fatalf("after the bad config: failures %v generation %v, want 1 and 3", m[`ferry_proxy_config_reloads_total{result="failure"}`], m["ferry_proxy_config_generation"])
	}
	produce(3)
	// 4: SIGHUP (ferry's systemd unit's ExecReload), with a key that needs a restart changed.
	raw = writeConfig(4, "max.connections: 999\n")
	if err := os.WriteFile(filepath.Join(realDir, "proxy.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	awaitReload(4, raw, true)
	produce(4)
	// 5: the ConfigMap update: a new versioned dir, ..data swapped to it.
	raw = writeConfig(5, "max.connections: 999\n")
	if err := os.Mkdir(filepath.Join(mount, "..v5"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mount, "..v5", "proxy.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..v5", filepath.Join(mount, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mount, "..data_tmp"), filepath.Join(mount, "..data")); err != nil {
		t.Fatal(err)
	}
	m = awaitReload(5, raw, true)
	produce(5)

	total := 6 * perPhase
	waitFor(t, 2*time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= total },
		func() string {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Sprintf("the consumer saw %d of %d records", len(got), total)
		})
	waitFor(t, 2*time.Minute, func() bool { return len(kc.Lines()) >= total },
		func() string {
			return fmt.Sprintf("kcat saw %d of %d records: %s", len(kc.Lines()), total, kc.Stderr())
		})
	after := proxyMetrics(t, admin)
	cancel()
	wg.Wait()

	// Every record carries the chain of its phase.
	check := func(who string, recs []reloadRecord) {
		seen := map[[2]int]bool{}
		for _, r := range recs {
			if r.Secret != want[r.Phase] {
				t.Errorf("%s: phase %d record %d: secret %q, want %q (the chain in force when it was produced)", who, r.Phase, r.Seq, r.Secret, want[r.Phase])
			}
			seen[[2]int{r.Phase, r.Seq}] = true
		}
		if len(seen) != total || len(recs) != total {
			t.Errorf("%s: %d records, %d distinct, want %d", who, len(recs), len(seen), total)
		}
	}
	mu.Lock()
	check("franz-go consumer", got)
	mu.Unlock()
	var kcRecs []reloadRecord
	for _, l := range kc.Lines() {
		var r reloadRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Errorf("kcat printed %q: %v", l, err)
			continue
		}
		kcRecs = append(kcRecs, r)
	}
	check("kcat", kcRecs)
	kc.stop()

	// No connection dropped.
	if v := bgErr.Load(); v != nil {
		t.Errorf("background producer failed: %v", v)
	}
	if v := consErr.Load(); v != nil {
		t.Errorf("consumer error: %v", v)
	}
	drops := hooks.disconnects.Load() // before the SIGTERM below, which closes every connection
	if n := drops; n != 0 {
		t.Errorf("franz-go clients saw %d broker disconnects, want 0", n)
	}
	if n := hooks.connects.Load() - connectsBefore; n != 0 {
		t.Errorf("franz-go clients opened %d connections after warm-up, want 0", n)
	}
	kcLog := kc.stderr.String()
	if strings.Contains(kcLog, "Disconnected") || strings.Contains(kcLog, "Connection refused") {
		t.Errorf("kcat saw a disconnect:\n%s", kcLog)
	}
	for _, k := range []string{`ferry_proxy_client_connections_total{listener="bootstrap"}`, `ferry_proxy_client_connections_total{listener="broker"}`} {
		if after[k] != before[k] {
			t.Errorf("%s went from %v to %v during the reloads: a client reconnected", k, before[k], after[k])
		}
	}
	for k, v := range after {
		if strings.HasPrefix(k, "ferry_proxy_errors_total") && v > 0 {
			t.Errorf("%s = %v", k, v)
		}
	}
	if after[`ferry_proxy_config_reloads_total{result="success"}`] != 4 || after[`ferry_proxy_config_reloads_total{result="failure"}`] != 1 ||
		after["ferry_proxy_config_generation"] != 5 {
		t.Errorf("reloads: success %v failure %v generation %v, want 4, 1, 5", after[`ferry_proxy_config_reloads_total{result="success"}`],
			after[`ferry_proxy_config_reloads_total{result="failure"}`], after["ferry_proxy_config_generation"])
	}
	p.interrupt(t, syscall.SIGTERM)
	logs := p.stderr.String()
	if n := strings.Count(logs, "config reloaded"); n != 4 {
		t.Errorf("%d 'config reloaded' log lines, want 4", n)
	}
	if n := strings.Count(logs, "config reload refused"); n != 1 || !strings.Contains(logs, "no-such-interceptor") {
		t.Errorf("%d 'config reload refused' lines (want 1, naming no-such-interceptor)", n)
	}
	if !strings.Contains(logs, "restart_required=\"[max.connections max.connections.per.ip]\"") {
		t.Errorf("no warning that max.connections needs a restart")
	}
	t.Logf("reloads: 4 applied, 1 refused; records: %d per phase x 6 through franz-go and kcat; background produces: %d; "+
		"client disconnects: %d; proxy connections accepted during the reloads: %v",
		perPhase, bgOK.Load(), drops,
		after[`ferry_proxy_client_connections_total{listener="bootstrap"}`]+after[`ferry_proxy_client_connections_total{listener="broker"}`]-
			before[`ferry_proxy_client_connections_total{listener="bootstrap"}`]-before[`ferry_proxy_client_connections_total{listener="broker"}`])
}

// proxyAddrs waits for a `ferry proxy` process (started with --admin or
// admin.listen) to print its bootstrap address and its admin listener's
// host:port, within 2 minutes.
func proxyAddrs(t *testing.T, p *ferryProc) (bootstrap, admin string) {
	t.Helper()
	for bootstrap == "" || admin == "" {
		select {
		case l := <-p.lines:
			if s, ok := strings.CutPrefix(l, "ferry proxy: bootstrap "); ok {
				bootstrap, _, _ = strings.Cut(s, " ")
			}
			if s, ok := strings.CutPrefix(l, "ferry proxy: metrics http://"); ok {
				admin = strings.TrimSuffix(s, "/metrics")
			}
		case <-p.exited:
			t.Fatalf("ferry proxy exited %d: %s", p.code, p.stderr.String())
		case <-time.After(2 * time.Minute):
			t.Fatal("ferry proxy did not start within 2 min")
		}
	}
	return bootstrap, admin
}
