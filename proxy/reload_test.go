package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

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

// The reload metrics appear on /metrics from the start, and a Reload to no
// interceptors at all passes requests opaque from then on.
func TestReloadMetricsAndEmptyChain(t *testing.T) {
	s := reloadServer(t, interceptor.Spec{Name: "redact", Config: map[string]string{"redact.fields": "a"}})
	if err := s.Reload(context.Background(), Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Version: "v2"}); err != nil {
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
