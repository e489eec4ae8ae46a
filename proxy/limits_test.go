package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// logCounter is a slog.Handler that keeps the level and message of every
// record, for tests that count log lines.
type logCounter struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCounter) WithGroup(string) slog.Handler      { return h }

// count is the number of records at level whose message contains substr.
func (h *logCounter) count(level slog.Level, substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, substr) {
			n++
		}
	}
	return n
}

// max.connections' default follows the descriptor limit: two descriptors
// per client connection, a tenth (at least 256) kept back.
func TestMaxConnectionsForFDs(t *testing.T) {
	for _, tc := range []struct {
		fds  uint64
		want int
	}{
		{0, 1_000_000},              // unknown or unlimited
		{1 << 40, 1_000_000},        // far more than any fleet
		{1024, (1024 - 256) / 2},    // a common soft limit
		{20000, (20000 - 2000) / 2}, // a tenth kept
		{1048576, (1048576 - 104857) / 2},
		{300, 64}, // too few to reserve from: a floor
	} {
		if got := maxConnectionsForFDs(tc.fds); got != tc.want {
			t.Errorf("maxConnectionsForFDs(%d) = %d, want %d", tc.fds, got, tc.want)
		}
	}
	var c Config
	c.setDefaults()
	if c.MaxConnections != DefaultMaxConnections() || c.MaxConnections < 64 {
		t.Fatalf("max.connections default %d, want %d", c.MaxConnections, DefaultMaxConnections())
	}
	if c.MaxConnectionsPerIP != c.MaxConnections/4 {
		t.Fatalf("max.connections.per.ip default %d, want a quarter of %d", c.MaxConnectionsPerIP, c.MaxConnections)
	}
	if c.FirstRequestTimeout != 10*time.Second || c.IdleTimeout != 10*time.Minute {
		t.Fatalf("connections.first.request.timeout.ms %v, connections.max.idle.ms %v", c.FirstRequestTimeout, c.IdleTimeout)
	}
	// Given max.connections, the per-address share follows it, but a small
	// max.connections still lets one host use all of it up to 64.
	for _, tc := range []struct{ max, perIP int }{{10, 10}, {64, 64}, {200, 64}, {256, 64}, {1000, 250}} {
		c = Config{MaxConnections: tc.max}
		c.setDefaults()
		if c.MaxConnectionsPerIP != tc.perIP {
			t.Fatalf("max.connections.per.ip default with max.connections %d: %d, want %d", tc.max, c.MaxConnectionsPerIP, tc.perIP)
		}
	}
	c = Config{MaxConnections: 1}
	c.setDefaults()
	if c.MaxConnectionsPerIP != 1 {
		t.Fatalf("max.connections.per.ip default with max.connections 1: %d, want 1", c.MaxConnectionsPerIP)
	}
}

// limitsProxy is a proxy in front of kfake with the given limits and a
// log counter.
func limitsProxy(t *testing.T, cfg Config) (*Server, *logCounter) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	logs := &logCounter{}
	cfg.Upstream, cfg.Listen, cfg.Logger = c.ListenAddrs(), "127.0.0.1:0", slog.New(logs)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, logs
}

// dialFrom connects to addr from the local address ip (any port).
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// served reports whether c gets an answer to ApiVersions.
func served(c net.Conn) bool {
	if _, err := c.Write(apiVersionsV0); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return false
	}
	_, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(size[:])))
	return err == nil
}

// closedByProxy waits (up to 20 s) for c to be closed by the far end.
func closedByProxy(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// At max.connections.per.ip one more connection from that address is
// closed at accept, counted and logged once; another address is served;
// at max.connections everyone's next connection is closed.
func TestConnectionLimitsAtTheLimit(t *testing.T) {
	s, logs := limitsProxy(t, Config{MaxConnections: 4, MaxConnectionsPerIP: 2})
	a1, a2 := dialFrom(t, "127.0.0.1", s.Addr()), dialFrom(t, "127.0.0.1", s.Addr())
	if !served(a1) || !served(a2) {
		t.Fatal("connections within max.connections.per.ip not served")
	}
	for range 3 {
		if !closedByProxy(dialFrom(t, "127.0.0.1", s.Addr())) {
			t.Fatal("a third connection from 127.0.0.1 stayed open with max.connections.per.ip 2")
		}
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("too_many_connections_per_ip")); n != 3 {
		t.Fatalf(`errors_total{kind="too_many_connections_per_ip"} = %v, want 3`, n)
	}
	if n := logs.count(slog.LevelWarn, "max.connections.per.ip reached"); n != 1 {
		t.Fatalf("%d warnings for 3 refusals, want 1 (rate-limited)", n)
	}
	b1, b2 := dialFrom(t, "127.0.0.2", s.Addr()), dialFrom(t, "127.0.0.2", s.Addr())
	if !served(b1) || !served(b2) {
		t.Fatal("another address was not served while 127.0.0.1 was at its limit")
	}
	if !closedByProxy(dialFrom(t, "127.0.0.3", s.Addr())) {
		t.Fatal("a fifth connection stayed open with max.connections 4")
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("too_many_connections")); n != 1 {
		t.Fatalf(`errors_total{kind="too_many_connections"} = %v, want 1`, n)
	}
	// A slot freed is a slot taken again.
	a1.Close()
	for deadline := time.Now().Add(20 * time.Second); connCount(s) > 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a closed connection kept its slot")
		}
	}
	if !served(dialFrom(t, "127.0.0.1", s.Addr())) {
		t.Fatal("no slot after a connection closed")
	}
}

// A connection that sends part of a request header and stalls is closed
// at connections.first.request.timeout.ms, far before connections.max.idle.ms;
// one that has sent a whole request is not, however long it then waits;
// one whose first request waits for an unreachable broker is not either.
func TestFirstRequestTimeout(t *testing.T) {
	const first = 300 * time.Millisecond
	s, logs := limitsProxy(t, Config{FirstRequestTimeout: first, IdleTimeout: time.Hour})
	established := dialFrom(t, "127.0.0.1", s.Addr())
	if !served(established) {
		t.Fatal("not served")
	}
	var stalled []net.Conn
	start := time.Now()
	for i := range 5 {
		c := dialFrom(t, "127.0.0.1", s.Addr())
		_, _ = c.Write(apiVersionsV0[:1+i%6]) // a few bytes of the size and header
		stalled = append(stalled, c)
	}
	for i, c := range stalled {
		if !closedByProxy(c) {
			t.Fatalf("stalled connection %d not closed", i)
		}
	}
	if took := time.Since(start); took < first {
		t.Fatalf("stalled connections closed after %v, before connections.first.request.timeout.ms %v", took, first)
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("first_request_timeout")); n != 5 {
		t.Fatalf(`errors_total{kind="first_request_timeout"} = %v, want 5`, n)
	}
	if n := logs.count(slog.LevelWarn, "connections.first.request.timeout.ms"); n != 1 {
		t.Fatalf("%d warnings for 5 closed connections, want 1 (rate-limited)", n)
	}
	// Well past the deadline, the established client is still served.
	time.Sleep(2 * first)
	if !served(established) {
		t.Fatal("a client that had sent its first request was closed by connections.first.request.timeout.ms")
	}

	// The first request held for an unreachable broker (upstream.go) is
	// the proxy's wait: the connection is reset at
	// upstream.connect.timeout.ms, not closed at the first-request deadline.
	held := startHeldProxy(t, Config{Upstream: []string{deadAddr(t)}, FirstRequestTimeout: first,
		ConnectTimeout: 5 * first, ReconnectBackoff: 50 * time.Millisecond})
	c := dialFrom(t, "127.0.0.1", held.Addr())
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(4)
	_, _ = c.Write(kmsg.NewRequestFormatter().AppendRequest(nil, md, 1)) // size prefixed
	heldStart := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if err == nil {
		t.Fatal("a request to a dead broker was answered")
	}
	if took := time.Since(heldStart); took < 4*first {
		t.Fatalf("a held first request was closed after %v (%v), before upstream.connect.timeout.ms %v", took, err, 5*first)
	}
	if n := testutil.ToFloat64(held.m.errors.WithLabelValues("first_request_timeout")); n != 0 {
		t.Fatalf("a held first request counted as a first-request timeout")
	}
}

// connections.first.request.timeout.ms and the limits are file keys.
func TestConnectionLimitKeys(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		yaml       string
		first      time.Duration
		max, perIP int
		err        string
	}{
		{"connections.first.request.timeout.ms: 2500\nmax.connections: 10000\nmax.connections.per.ip: 300\n", 2500 * time.Millisecond, 10000, 300, ""},
		{"connections.first.request.timeout.ms: -1\n", -1, 0, 0, ""},
		{"connections.first.request.timeout.ms: soon\n", 0, 0, 0, "connections.first.request.timeout.ms"},
		{"max.connections.per.address: 3\n", 0, 0, 0, "unknown key"},
	} {
		path := filepath.Join(dir, "p.yaml")
		if err := os.WriteFile(path, []byte("upstream: 127.0.0.1:9092\nlisten: 127.0.0.1:0\n"+tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfigFile(path)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want one naming %s", tc.yaml, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if c.FirstRequestTimeout != tc.first || c.MaxConnections != tc.max || c.MaxConnectionsPerIP != tc.perIP {
			t.Errorf("%q: got %v %d %d", tc.yaml, c.FirstRequestTimeout, c.MaxConnections, c.MaxConnectionsPerIP)
		}
	}
}
