package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
)

// reloadClosed counts the instances of "reload-test" closed.
var reloadClosed atomic.Int64

type passThrough struct{ re *regexp.Regexp }

func (p passThrough) Name() string                                             { return "reload-test" }
func (p passThrough) TopicPattern() *regexp.Regexp                             { return p.re }
func (p passThrough) ProcessRecord(context.Context, *interceptor.Record) error { return nil }

func init() {
	interceptor.Register("reload-test", func(_ context.Context, cfg map[string]string) (interceptor.Instance, error) {
		re, err := interceptor.CompileTopicPattern(cfg[interceptor.KeyTopicPattern])
		if err != nil {
			return interceptor.Instance{}, err
		}
		return interceptor.Instance{Produce: passThrough{re}, Close: func() error { reloadClosed.Add(1); return nil }}, nil
	})
}

func reloadServer(t *testing.T, specs ...interceptor.Spec) *Server {
	t.Helper()
	s, err := New(Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Interceptors: specs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s
}

func reloadCounts(s *Server) (ok, failed float64) {
	return testutil.ToFloat64(s.rm.reloads.WithLabelValues("success")), testutil.ToFloat64(s.rm.reloads.WithLabelValues("failure"))
}

// A request holding the old chain keeps it open across a reload; the
// chain's interceptors are closed when that request lets go, not before.
func TestReloadOldChainClosedAfterLastRequest(t *testing.T) {
	spec := interceptor.Spec{Name: "reload-test", Config: map[string]string{"topic.pattern": "a.*"}}
	s := reloadServer(t, spec)
	before := reloadClosed.Load()
	held := s.acquireChain() // a request in flight on generation 1
	if !held.hasProduce() || held.gen != 1 {
		t.Fatalf("generation %d, produce %v: want 1, true", held.gen, held.hasProduce())
	}
	spec2 := interceptor.Spec{Name: "reload-test", Config: map[string]string{"topic.pattern": "b.*"}}
	if err := s.Reload(context.Background(), Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{spec2}}); err != nil {
		t.Fatal(err)
	}
	if gen, _ := s.ChainGeneration(); gen != 2 {
		t.Fatalf("generation %d after a reload, want 2", gen)
	}
	next := s.acquireChain()
	if next.gen != 2 || next == held {
		t.Fatalf("a new request got generation %d, want 2", next.gen)
	}
	next.release()
	if n := reloadClosed.Load() - before; n != 0 {
		t.Fatalf("%d instances closed while a request still holds the old chain", n)
	}
	held.release()
	if n := reloadClosed.Load() - before; n != 1 {
		t.Fatalf("%d instances closed once the last request let go, want 1", n)
	}
	if ok, failed := reloadCounts(s); ok != 1 || failed != 0 {
		t.Fatalf("reloads success %v failure %v, want 1 0", ok, failed)
	}
}

// Each kind of bad configuration is refused with an error naming it; the
// running chain stays and the failure is counted.
func TestReloadRefusesBadConfig(t *testing.T) {
	good := interceptor.Spec{Name: "redact", Config: map[string]string{"redact.fields": "a"}}
	s := reloadServer(t, good)
	base := Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		spec interceptor.Spec
		want string
	}{
		{"unknown interceptor", interceptor.Spec{Name: "no-such"}, "no-such"},
		{"invalid pattern", interceptor.Spec{Name: "redact", Config: map[string]string{"redact.fields": "a", "topic.pattern": "("}}, "topic.pattern"},
		{"bad redact path", interceptor.Spec{Name: "redact", Config: map[string]string{"redact.fields": ""}}, "redact.fields"},
		{"store that does not open", interceptor.Spec{Name: "large-message", Config: map[string]string{"large.message.payload.store.url": "nosuchscheme://x"}}, "nosuchscheme"},
	} {
		c := base
		c.Interceptors = []interceptor.Spec{tc.spec}
		err := s.Reload(context.Background(), c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one naming %q", tc.name, err, tc.want)
		}
	}
	// A Config that does not validate.
	if err := s.Reload(context.Background(), Config{Listen: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "upstream") {
		t.Errorf("no upstream: err %v", err)
	}
	if gen, _ := s.ChainGeneration(); gen != 1 {
		t.Fatalf("generation %d after refused reloads, want 1", gen)
	}
	if ok, failed := reloadCounts(s); ok != 0 || failed != 5 {
		t.Fatalf("reloads success %v failure %v, want 0 5", ok, failed)
	}
	g := s.acquireChain()
	defer g.release()
	if !g.hasProduce() {
		t.Fatal("the running chain was lost")
	}
}

// Keys a reload cannot apply are named; the reloadable ones are not.
func TestReloadRestartOnlyKeys(t *testing.T) {
	a := Config{Upstream: []string{"h:1"}, Listen: "127.0.0.1:1"}
	a.setDefaults()
	b := a
	b.Interceptors = []interceptor.Spec{{Name: "redact"}}
	b.InterceptorTimeout = time.Second
	if keys := restartOnly(a, b); len(keys) != 0 {
		t.Fatalf("reloadable changes reported as needing a restart: %v", keys)
	}
	b.Upstream = []string{"h:2"}
	b.MaxConnections = 7
	b.ClientTLS.Cert = "x"
	if keys := strings.Join(restartOnly(a, b), ","); keys != "upstream,tls.client.*,max.connections" {
		t.Fatalf("restart keys %q", keys)
	}
}

// Every configuration key a reload does not apply is named when it changes,
// never reported as "other keys": an operator who changed the SNI host
// names (or any other restart-only key) is told which key waits for a
// restart.
func TestReloadRestartOnlyKeysNamed(t *testing.T) {
	a := Config{Upstream: []string{"h:1"}, Listen: "127.0.0.1:1"}
	a.setDefaults()
	for _, tc := range []struct {
		key    string
		change func(*Config)
	}{
		{"sni.bootstrap.host", func(c *Config) { c.SNI.BootstrapHost = "boot.kafka.test" }},
		{"sni.broker.host.pattern", func(c *Config) { c.SNI.BrokerHostPattern = "b-$(nodeId).kafka.test" }},
		{"sni.advertised.port", func(c *Config) { c.SNI.AdvertisedPort = 443 }},
		{"upstream.connect.timeout.ms", func(c *Config) { c.ConnectTimeout = time.Minute }},
		{"upstream.reconnect.backoff.ms", func(c *Config) { c.ReconnectBackoff = time.Minute }},
		{"upstream.reconnect.backoff.max.ms", func(c *Config) { c.ReconnectBackoffMax = time.Hour }},
		{"metrics.topics.max", func(c *Config) { c.MetricsMaxTopics = 7 }},
		{"tracing.*", func(c *Config) { c.Tracing.Enabled = true }},
	} {
		b := a
		tc.change(&b)
		if keys := strings.Join(restartOnly(a, b), ","); keys != tc.key {
			t.Errorf("changed %s: restart keys %q", tc.key, keys)
		}
	}
}

// Every field of Config is reloadable, code-only, or named by restartKeys: a
// field added later without a key would be reported as "other keys" again.
func TestReloadRestartKeysCoverConfig(t *testing.T) {
	skip := map[string]bool{ // reloadable, or not configuration
		"Interceptors": true, "ReloadAllowUnprotected": true, "InterceptorTimeout": true,
		"BatchDecompressedMax": true, "RequestDecompressedMax": true,
		"TracerProvider": true, "Logger": true, "Version": true,
	}
	var a Config
	a.setDefaults()
	ct := reflect.TypeOf(a)
	for i := range ct.NumField() {
		f := ct.Field(i)
		if skip[f.Name] || !f.IsExported() {
			continue
		}
		b := a
		if !setNonZero(reflect.ValueOf(&b).Elem().Field(i)) {
			t.Errorf("field %s: cannot change it in the test", f.Name)
			continue
		}
		if keys := restartOnly(a, b); len(keys) != 1 || keys[0] == "other keys" {
			t.Errorf("changed field %s: restart keys %q, want its own key", f.Name, keys)
		}
	}
}

// setNonZero changes v (its first field it can, for a struct).
func setNonZero(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.String {
			return false
		}
		v.Set(reflect.Append(v, reflect.ValueOf("x").Convert(v.Type().Elem())))
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && setNonZero(v.Field(i)) {
				return true
			}
		}
		return false
	default:
		return false
	}
	return true
}

// The reload metrics appear on /metrics from the start, and a Reload to no
// interceptors at all passes requests opaque from then on.
func TestReloadMetricsAndEmptyChain(t *testing.T) {
	s := reloadServer(t, interceptor.Spec{Name: "redact", Config: map[string]string{"redact.fields": "a"}})
	if err := s.Reload(context.Background(), Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Version: "v2",
		ReloadAllowUnprotected: true}); err != nil {
		t.Fatal(err)
	}
	g := s.acquireChain()
	if g.active() || g.gen != 2 {
		t.Fatalf("after reloading to no interceptors: active %v generation %d", g.active(), g.gen)
	}
	g.release()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{`ferry_proxy_config_reloads_total{result="success"} 1`, `ferry_proxy_config_reloads_total{result="failure"} 0`,
		`ferry_proxy_config_info{version="v2"} 1`, "ferry_proxy_config_generation 2", "ferry_proxy_config_last_reload_success_timestamp_seconds "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// gate is an interceptor that holds each record until released, and
// marks the records it handled with a header naming its instance.
type gate struct {
	re      *regexp.Regexp
	mark    string
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Name() string                 { return "gate" }
func (g *gate) TopicPattern() *regexp.Regexp { return g.re }
func (g *gate) ProcessRecord(ctx context.Context, r *interceptor.Record) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: "chain", Value: []byte(g.mark)})
	return nil
}

var (
	gates      sync.Map // mark -> *gate
	gateClosed sync.Map // mark -> true once closed
)

func init() {
	interceptor.Register("gate", func(_ context.Context, cfg map[string]string) (interceptor.Instance, error) {
		g := &gate{re: regexp.MustCompile(".*"), mark: cfg["mark"], entered: make(chan struct{}, 1), release: make(chan struct{})}
		if cfg["open"] == "true" {
			close(g.release)
		}
		gates.Store(g.mark, g)
		return interceptor.Instance{Produce: g, Close: func() error { gateClosed.Store(g.mark, true); return nil }}, nil
	})
}

func gateOf(t *testing.T, mark string) *gate {
	t.Helper()
	v, ok := gates.Load(mark)
	if !ok {
		t.Fatalf("no gate %q built", mark)
	}
	return v.(*gate)
}

// A Produce request held by an interceptor when a reload happens finishes
// on the chain it started with (its record gets that chain's mark), the
// next request takes the new chain, the old chain is closed only once its
// request is answered, and the client's connection stays.
func TestReloadInFlightRequestFinishesOnOldChain(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mark := func(m string, open bool) []interceptor.Spec {
		return []interceptor.Spec{{Name: "gate", Config: map[string]string{"mark": m, "open": strconv.FormatBool(open)}}}
	}
	old, next := t.Name()+"-old", t.Name()+"-new"
	// A run before this one (go test -count N) left its marks closed.
	gateClosed.Delete(old)
	gateClosed.Delete(next)
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", InterceptorTimeout: time.Minute,
		Interceptors: mark(old, false), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	var hooks disconnects
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.DefaultProduceTopic("t"), kgo.WithHooks(&hooks))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := make(chan error, 1)
	cl.Produce(ctx, &kgo.Record{Value: []byte("1")}, func(_ *kgo.Record, err error) { first <- err })
	g := gateOf(t, old)
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("the first record never reached the interceptor")
	}
	if err := s.Reload(ctx, Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", InterceptorTimeout: time.Minute,
		Interceptors: mark(next, true)}); err != nil {
		t.Fatal(err)
	}
	if _, closed := gateClosed.Load(old); closed {
		t.Fatal("the old chain was closed while a request was in it")
	}
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, closed := gateClosed.Load(old); !closed && time.Now().Before(deadline); _, closed = gateClosed.Load(old) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, closed := gateClosed.Load(old); !closed {
		t.Fatal("the old chain was not closed after its last request")
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var marks []string
	for len(marks) < 2 && ctx.Err() == nil {
		cons.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "chain" {
					marks = append(marks, string(r.Value)+"="+string(h.Value))
				}
			}
		})
	}
	if want := []string{"1=" + old, "2=" + next}; !slices.Equal(marks, want) {
		t.Fatalf("records marked %v, want %v", marks, want)
	}
	if n := hooks.n.Load(); n != 0 {
		t.Fatalf("the client saw %d disconnects", n)
	}
}

type disconnects struct{ n atomic.Int64 }

func (d *disconnects) OnBrokerDisconnect(kgo.BrokerMetadata, net.Conn) { d.n.Add(1) }

// SIGTERM's Shutdown drains: /healthz turns 503 at once (Kubernetes stops
// routing) while /livez stays 200, new connections are refused, and the
// request in flight is answered before the proxy stops.
func TestShutdownDrainsAndHealthzNotReady(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mark := t.Name()
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", InterceptorTimeout: time.Minute,
		Interceptors: []interceptor.Spec{{Name: "gate", Config: map[string]string{"mark": mark}}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	status := func(path string) int {
		resp, err := http.Get("http://" + s.AdminAddr() + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if a, b := status("/healthz"), status("/livez"); a != 200 || b != 200 {
		t.Fatalf("serving: /healthz %d /livez %d, want 200 200", a, b)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	cl.Produce(ctx, &kgo.Record{Value: []byte("in flight")}, func(_ *kgo.Record, err error) { done <- err })
	g := gateOf(t, mark)
	<-g.entered
	addr := s.Addr()
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for status("/healthz") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/healthz still ready while draining")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := status("/livez"); n != 200 {
		t.Fatalf("/livez %d while draining, want 200 (alive)", n)
	}
	if cn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		cn.Close()
		t.Fatal("the bootstrap listener accepts connections while draining")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(g.release)
	if err := <-done; err != nil {
		t.Fatalf("the request in flight at SIGTERM failed: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// A configuration that cannot be loaded (ReloadWith's load error, e.g. a
// file that does not parse) is a refused reload too.
func TestReloadWithLoadError(t *testing.T) {
	s := reloadServer(t)
	err := s.ReloadWith(context.Background(), "test", func() (Config, error) {
		return Config{}, errors.New("config file x.yaml: yaml: line 3: did not find expected key")
	})
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("err %v", err)
	}
	if ok, failed := reloadCounts(s); ok != 0 || failed != 1 {
		t.Fatalf("reloads success %v failure %v, want 0 1", ok, failed)
	}
	if gen, _ := s.ChainGeneration(); gen != 1 {
		t.Fatalf("generation %d, want 1", gen)
	}
}
