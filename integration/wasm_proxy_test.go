package integration

// The wasm interceptor (issue 20) in a `ferry proxy` process against the
// real broker: hostile modules each cost their own partition its request
// while a canary client on another topic (through an upper-casing module)
// keeps working, the failures are counted by kind, and the peak RSS stays
// within the documented bound; a module file replaced by garbage is refused
// at SIGHUP (the old module keeps running), a good one is picked up.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// wasmModule is the absolute path of a test module of interceptor/wasm.
func wasmModule(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "interceptor", "wasm", "testdata", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// wasmFailures reads ferry_wasm_failures_total{module, kind} (all directions).
func (p *ferryProxy) wasmFailures(t *testing.T, module, kind string) float64 {
	t.Helper()
	var sum float64
	for _, l := range strings.Split(httpGet(t, p.metrics), "\n") {
		if strings.HasPrefix(l, "ferry_wasm_failures_total{") && strings.Contains(l, `module="`+module+`"`) && strings.Contains(l, `kind="`+kind+`"`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// consumeValues reads n values of topic from offset 0 with cl's options.
func consumeValues(t *testing.T, bootstrap, topic string, n int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := ctxT(t, 60*time.Second)
	var out []string
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d values of %s: %v", len(out), n, topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
	}
	return out
}

func TestWasmProxyHostileModules(t *testing.T) {
	brokers(t)
	bin := buildFerry(t)
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	const memMax = 192 << 20
	hostile := map[string]string{"loop": "timeout", "grow": "memory", "trap": "trap", "badptr": "bad_pointer", "huge": "output_too_large"}
	var ics strings.Builder
	topics := map[string]string{}
	for name := range hostile {
		topics[name] = namedTopic(t, "wasm-"+name+"-"+suffix, nil)
		fmt.Fprintf(&ics, `
  - name: wasm
    config:
      topic.pattern: "wasm-%s-.*"
      wasm.module.path: %s
      wasm.memory.max.bytes: 8388608
      wasm.instances.max: 2
`, name, wasmModule(t, name))
	}
	canary := namedTopic(t, "wasm-canary-"+suffix, nil)
	p := startFerryProxy(t, bin, fmt.Sprintf(`
upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
max.connections: 200
proxy.memory.max.bytes: %d
produce.request.interceptor.timeout.ms: 1000
interceptors:
  - name: wasm
    config:
      topic.pattern: "wasm-canary-.*"
      wasm.module.path: %s
      wasm.side: produce
%s`, brokers(t), memMax, wasmModule(t, "upper"), ics.String()))

	// The canary: produces through the proxy all along.
	var canaryErrs, canaryOK atomic.Int64
	stop := make(chan struct{})
	canaryDone := make(chan struct{})
	go func() {
		defer close(canaryDone)
		cl, err := kgo.NewClient(kgo.SeedBrokers(p.bootstrap), kgo.DefaultProduceTopic(canary))
		if err != nil {
			canaryErrs.Add(1)
			return
		}
		defer cl.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(fmt.Sprintf("canary-%d", i))}).FirstErr()
			cancel()
			if err != nil {
				t.Logf("canary %d: %v", i, err)
				canaryErrs.Add(1)
			} else {
				canaryOK.Add(1)
			}
		}
	}()

	// Each hostile module: its records are refused, again and again (its
	// instances replaced each time), and counted.
	// Not idempotent: an idempotent producer retries a REQUEST_TIMED_OUT
	// (the looping module) for good, as the batch may have been written.
	attacker, err := kgo.NewClient(kgo.SeedBrokers(p.bootstrap), kgo.RecordRetries(1), kgo.RecordDeliveryTimeout(20*time.Second),
		kgo.DisableIdempotentWrite(),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer attacker.Close()
	for round := range 3 {
		for name, topic := range topics {
			ctx := ctxT(t, 60*time.Second)
			err := attacker.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: bytes.Repeat([]byte("v"), 10<<10)},
				&kgo.Record{Topic: topic, Value: []byte("w")}).FirstErr()
			if err == nil {
				t.Fatalf("round %d: module %s: the produce succeeded", round, name)
			}
		}
	}
	for name, kind := range hostile {
		deadline := time.Now().Add(60 * time.Second)
		for p.wasmFailures(t, name+".wasm", kind) < 3 {
			if time.Now().After(deadline) {
				t.Fatalf("module %s: ferry_wasm_failures_total{kind=%q} is %v, want >= 3", name, kind, p.wasmFailures(t, name+".wasm", kind))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for deadline := time.Now().Add(60 * time.Second); canaryOK.Load() < 5; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the canary made fewer than 5 round trips")
		}
	}
	close(stop)
	<-canaryDone
	if canaryErrs.Load() != 0 {
		t.Fatalf("the canary client failed %d times (%d produces succeeded)", canaryErrs.Load(), canaryOK.Load())
	}
	// The canary's records were upper-cased by its module on the way in.
	for i, v := range consumeValues(t, brokers(t), canary, 3) {
		if v != fmt.Sprintf("CANARY-%d", i) {
			t.Fatalf("canary record %d stored as %q", i, v)
		}
	}
	rss := p.peakRSS(t)
	bound := int64(memMax + 128<<20 + 200*(100<<10)) // docs/SECURITY.md, with max.connections 200
	t.Logf("proxy peak RSS %d MiB (bound %d MiB); canary produces %d", rss>>20, bound>>20, canaryOK.Load())
	if rss > bound {
		t.Fatalf("proxy peak RSS %d MiB over the bound %d MiB", rss>>20, bound>>20)
	}
}

func TestWasmProxyReload(t *testing.T) {
	brokers(t)
	bin := buildFerry(t)
	topic := newTopic(t, nil)
	mod := filepath.Join(t.TempDir(), "m.wasm")
	copyFile := func(from string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(mod+".new", b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(mod+".new", mod); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(wasmModule(t, "upper"))
	p := startFerryProxy(t, bin, fmt.Sprintf(`
upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
interceptors: [{name: wasm, config: {topic.pattern: ".*", wasm.module.path: %s, wasm.side: produce}}]
`, brokers(t), mod))
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.bootstrap), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(v string) {
		t.Helper()
		if err := cl.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %q: %v", v, err)
		}
	}
	reload := func(result string, want float64) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if got := p.reloads(t, result); got >= want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s reload counted", result)
			}
		}
	}
	produce("hello")
	// Garbage in place of the module: refused, logged, the old module runs on.
	if err := os.WriteFile(mod, []byte("this is not WebAssembly"), 0o644); err != nil {
		t.Fatal(err)
	}
	reload("failure", 1)
	produce("again")
	if !strings.Contains(p.stderr.String(), "config reload refused") || !strings.Contains(p.stderr.String(), "not a valid WebAssembly module") {
		t.Fatalf("the refusal is not logged:\n%s", tail([]byte(p.stderr.String())))
	}
	// A changed module (no-op) is picked up.
	copyFile(wasmModule(t, "noop"))
	reload("success", 1)
	produce("third")
	got := consumeValues(t, brokers(t), topic, 3)
	if strings.Join(got, ",") != "HELLO,AGAIN,third" {
		t.Fatalf("stored %v, want HELLO,AGAIN,third", got)
	}
}

// reloads reads ferry_proxy_config_reloads_total{result}.
func (p *ferryProxy) reloads(t *testing.T, result string) float64 {
	t.Helper()
	for _, l := range strings.Split(httpGet(t, p.metrics), "\n") {
		if strings.HasPrefix(l, `ferry_proxy_config_reloads_total{result="`+result+`"}`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return v
		}
	}
	return 0
}

// TestWasmProxyFlags: `ferry proxy --interceptors wasm -X
// wasm.module.path=...` (flags instead of the YAML list) runs the module.
func TestWasmProxyFlags(t *testing.T) {
	brokers(t)
	bin := buildFerry(t)
	topic := newTopic(t, nil)
	// startFerryProxy takes a config file; the flags are appended by a
	// wrapper script.
	wrapper := filepath.Join(t.TempDir(), "ferry-flags")
	script := fmt.Sprintf("#!/bin/sh\nexec %q \"$@\" --interceptors wasm -X wasm.module.path=%q -X wasm.side=produce -X wasm.config.unused=1\n",
		bin, wasmModule(t, "upper"))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p := startFerryProxy(t, wrapper, fmt.Sprintf("upstream: %s\nlisten: 127.0.0.1:0\nadmin.listen: 127.0.0.1:0\n", brokers(t)))
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.bootstrap), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Value: []byte("hello")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if got := consumeValues(t, brokers(t), topic, 1); got[0] != "HELLO" {
		t.Fatalf("stored %q", got[0])
	}
}
