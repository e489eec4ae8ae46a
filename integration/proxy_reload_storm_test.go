package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestProxyReloadStorm: a `ferry proxy` process gets a storm of reloads —
// 150 SIGHUPs (about 30 a second) and 15 rewrites of its config file,
// alternating between a chain with large-message on a file store and one
// without — while a franz-go producer sends records through it. No record
// fails, no client connection drops, and the process' goroutines and open
// files come back to what they were before the storm (each retired
// chain's store is closed).
func TestProxyReloadStorm(t *testing.T) {
	upstream := brokers(t)
	bin := buildFerry(t)
	topic := newTopic(t, nil)
	storeDir := t.TempDir()
	config := filepath.Join(t.TempDir(), "proxy.yaml")
	write := func(i int) {
		var b strings.Builder
		fmt.Fprintf(&b, "upstream: %s\nlisten: 127.0.0.1:0\nadmin.listen: 127.0.0.1:0\ninterceptors:\n", upstream)
		if i%2 == 0 {
			fmt.Fprintf(&b, "  - name: large-message\n    config:\n      topic.pattern: %q\n      large.message.payload.store.url: file://%s\n      large.message.threshold.bytes: \"%d\"\n",
				topic, storeDir, 1000+i)
		} else {
			b.WriteString("  []\n")
		}
		if err := os.WriteFile(config+".tmp", []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(config+".tmp", config); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	p := startFerryProc(t, bin, "proxy", "--config", config)
	bootstrap, admin := proxyAddrs(t, p)
	var hooks connHooks
	cl := viaClient(t, bootstrap, kgo.DefaultProduceTopic(topic), kgo.WithHooks(&hooks), kgo.ConnIdleTimeout(15*time.Minute))
	produce := func(n int) {
		var wg sync.WaitGroup
		var failed error
		var mu sync.Mutex
		for i := range n {
			wg.Add(1)
			cl.Produce(context.Background(), &kgo.Record{Value: make([]byte, 3000+i%2000)}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
				wg.Done()
			})
		}
		wg.Wait()
		if failed != nil {
			t.Fatalf("a record failed: %v", failed)
		}
	}
	produce(50) // warm: connections and the store open
	settle := func() (goroutines, fds float64) {
		time.Sleep(2 * time.Second)
		m := proxyMetrics(t, admin)
		return m["go_goroutines"], m["process_open_fds"]
	}
	g0, f0 := settle()
	connects := hooks.connects.Load()

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				produce(20)
			}
		}
	}()
	for i := 1; i <= 150; i++ {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			write(i / 10)
		}
		time.Sleep(30 * time.Millisecond)
	}
	write(16) // ends on a large-message chain
	time.Sleep(time.Second)
	close(stop)
	<-done
	produce(50)
	m := proxyMetrics(t, admin)
	g1, f1 := settle()
	t.Logf("reloads: %v ok, %v refused; generation %v; goroutines %v -> %v; open fds %v -> %v; client disconnects %d",
		m[`ferry_proxy_config_reloads_total{result="success"}`], m[`ferry_proxy_config_reloads_total{result="failure"}`],
		m["ferry_proxy_config_generation"], g0, g1, f0, f1, hooks.disconnects.Load())
	if m[`ferry_proxy_config_reloads_total{result="success"}`] < 20 {
		t.Errorf("only %v reloads counted", m[`ferry_proxy_config_reloads_total{result="success"}`])
	}
	if d := hooks.disconnects.Load(); d != 0 || hooks.connects.Load() != connects {
		t.Errorf("client connections: %d disconnects, %d new connections during the storm", d, hooks.connects.Load()-connects)
	}
	if g1 > g0+10 || f1 > f0+5 {
		t.Errorf("after the storm: goroutines %v -> %v, open fds %v -> %v", g0, g1, f0, f1)
	}
}
