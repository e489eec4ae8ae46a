package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// deadAddr is a loopback address nothing listens on (connection refused),
// as a broker that is restarting.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func startHeldProxy(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// apiVersionsV0 is an ApiVersions v0 request frame (correlation id 1, null
// client id): what every client sends first.
var apiVersionsV0 = []byte{0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff}

func connCount(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) failedDials() float64 {
	return testutil.ToFloat64(s.m.upstreamConnects.WithLabelValues("error"))
}

// A broker that cannot be reached when the client connects (it is
// restarting) and comes back within upstream.connect.timeout.ms costs the
// client only time: its first request is held and answered.
func TestUpstreamDownHoldsFirstRequest(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dead := deadAddr(t)
	s := startHeldProxy(t, Config{Upstream: []string{dead}, ReconnectBackoff: 20 * time.Millisecond, ReconnectBackoffMax: 200 * time.Millisecond})
	const down = 1500 * time.Millisecond
	go func() {
		// The broker comes back on its address: a relay to the cluster.
		time.Sleep(down)
		ln, err := net.Listen("tcp", dead)
		if err != nil {
			t.Errorf("relay: %v", err)
			return
		}
		t.Cleanup(func() { ln.Close() })
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", c.ListenAddrs()[0])
			if err != nil {
				in.Close()
				continue
			}
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(context.Background(), cl)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("ApiVersions through a proxy whose broker was down for %s: %v (after %s)", down, err, took)
	}
	if resp.ErrorCode != 0 || len(resp.ApiKeys) == 0 {
		t.Fatalf("ApiVersions answer: error %d, %d keys", resp.ErrorCode, len(resp.ApiKeys))
	}
	if took < down-100*time.Millisecond {
		t.Fatalf("answered after %s, before the broker was back (%s): nothing was held", took, down)
	}
	if n := s.failedDials(); n < 3 {
		t.Fatalf("%v failed dials while the broker was down: it was not dialled again with backoff", n)
	}
}

// At upstream.connect.timeout.ms the held connection is reset (RST), which
// franz-go takes as a retriable network error, not the plain close it reads
// as "is TLS missing?" (ErrFirstReadEOF, not retriable).
func TestUpstreamConnectTimeoutResets(t *testing.T) {
	const limit = 800 * time.Millisecond
	s := startHeldProxy(t, Config{Upstream: []string{deadAddr(t)}, ConnectTimeout: limit,
		ReconnectBackoff: 50 * time.Millisecond, ReconnectBackoffMax: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := conn.Write(apiVersionsV0); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = conn.Read(make([]byte, 64))
	took := time.Since(start)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after upstream.connect.timeout.ms: %v, want connection reset", err)
	}
	if took < limit-50*time.Millisecond || took > limit+2*time.Second {
		t.Fatalf("reset after %s, want about upstream.connect.timeout.ms (%s)", took, limit)
	}

	// franz-go: a retriable syscall error, not ErrFirstReadEOF.
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = kmsg.NewPtrApiVersionsRequest().RequestWith(context.Background(), cl)
	if _, eof := errors.AsType[*kgo.ErrFirstReadEOF](err); eof || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("franz-go through a proxy whose broker stays down: %v, want a connection reset", err)
	}
}

// A client that gives up (closes) while its request is held stops the
// dialling for it.
func TestUpstreamHeldClientLeaves(t *testing.T) {
	s := startHeldProxy(t, Config{Upstream: []string{deadAddr(t)},
		ReconnectBackoff: 20 * time.Millisecond, ReconnectBackoffMax: 50 * time.Millisecond})
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	before := s.failedDials()
	if _, err := conn.Write(apiVersionsV0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	conn.Close()
	time.Sleep(300 * time.Millisecond) // the last backoff and dial end
	n1 := s.failedDials()
	if n1-before < 3 {
		t.Fatalf("%v failed dials while the client waited: not dialled again", n1-before)
	}
	time.Sleep(time.Second)
	if n2 := s.failedDials(); n2 != n1 {
		t.Fatalf("still dialling after the client left: %v failed dials, then %v", n1, n2)
	}
	deadline := time.Now().Add(5 * time.Second)
	for connCount(s) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after the client left", connCount(s))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// upstream.connect.timeout.ms -1: one attempt, then the reset at once.
func TestUpstreamConnectOnce(t *testing.T) {
	s := startHeldProxy(t, Config{Upstream: []string{deadAddr(t)}, ConnectTimeout: -1})
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	before := s.failedDials()
	start := time.Now()
	if _, err := conn.Write(apiVersionsV0); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Read(make([]byte, 64))
	if !errors.Is(err, syscall.ECONNRESET) || time.Since(start) > time.Second {
		t.Fatalf("after %s: %v, want a connection reset at once", time.Since(start), err)
	}
	if n := s.failedDials() - before; n != 1 {
		t.Fatalf("%v dials, want 1", n)
	}
}

func TestUpstreamConnectConfig(t *testing.T) {
	c, err := LoadConfigFile(writeYAML(t, `
upstream: k:9092
listen: 127.0.0.1:0
upstream.connect.timeout.ms: 45000
upstream.reconnect.backoff.ms: 100
upstream.reconnect.backoff.max.ms: 2000
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.ConnectTimeout != 45*time.Second || c.ReconnectBackoff != 100*time.Millisecond || c.ReconnectBackoffMax != 2*time.Second {
		t.Fatalf("parsed %v %v %v", c.ConnectTimeout, c.ReconnectBackoff, c.ReconnectBackoffMax)
	}
	c, err = LoadConfigFile(writeYAML(t, "upstream: k:9092\nlisten: 127.0.0.1:0\nupstream.connect.timeout.ms: -1\n"))
	if err != nil || c.ConnectTimeout != -1 {
		t.Fatalf("-1: %v %v", c.ConnectTimeout, err)
	}
	var d Config
	d.setDefaults()
	if d.ConnectTimeout != DefaultConnectTimeout || d.ReconnectBackoff != DefaultReconnectBackoff || d.ReconnectBackoffMax != DefaultReconnectBackoffMax {
		t.Fatalf("defaults %v %v %v", d.ConnectTimeout, d.ReconnectBackoff, d.ReconnectBackoffMax)
	}
	// The largest value is accepted; one more is refused, naming the key.
	if _, err := LoadConfigFile(writeYAML(t, "upstream: k:9092\nlisten: 127.0.0.1:0\nupstream.connect.timeout.ms: 2147483647\n")); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if _, err := LoadConfigFile(writeYAML(t, "upstream: k:9092\nlisten: 127.0.0.1:0\nupstream.connect.timeout.ms: 2147483648\n")); err == nil || !strings.Contains(err.Error(), "upstream.connect.timeout.ms") {
		t.Fatalf("over the limit: %v", err)
	}
	bad := Config{Upstream: []string{"k:9092"}, Listen: "127.0.0.1:0", ReconnectBackoff: time.Second, ReconnectBackoffMax: time.Millisecond}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "upstream.reconnect.backoff.max.ms") {
		t.Fatalf("backoff max under backoff: %v", err)
	}
	if _, err := New(Config{Upstream: []string{"k:9092"}, Listen: "127.0.0.1:0", ReconnectBackoff: -time.Millisecond}); err == nil {
		t.Fatal("a negative upstream.reconnect.backoff.ms was accepted")
	}
}

// rawRequest writes req (non-flexible header, client id "t") on conn and
// reads its response frame.
func rawRequest(t *testing.T, conn net.Conn, req kmsg.Request, corr int32) {
	t.Helper()
	frame := make([]byte, 4, 64)
	frame = binary.BigEndian.AppendUint16(frame, uint16(req.Key()))
	frame = binary.BigEndian.AppendUint16(frame, uint16(req.GetVersion()))
	frame = binary.BigEndian.AppendUint32(frame, uint32(corr))
	frame = append(frame, 0, 1, 't')
	frame = req.AppendTo(frame)
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := ReadFrame(bufio.NewReader(conn), 1<<20); err != nil {
		t.Fatalf("%s: %v", kmsg.NameForKey(req.Key()), err)
	}
}

// A connection closed before the client was served (only ApiVersions
// answered) is reset, also on shutdown, so that franz-go does not take the
// close for missing TLS or SASL; once served, the close is plain.
func TestCloseAbortiveUntilServed(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := startHeldProxy(t, Config{Upstream: c.ListenAddrs()})
	fresh, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	served, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer served.Close()
	api := kmsg.NewPtrApiVersionsRequest()
	api.Version = 0
	rawRequest(t, fresh, api, 1)
	rawRequest(t, served, api, 1)
	meta := kmsg.NewPtrMetadataRequest()
	meta.Version = 1
	rawRequest(t, served, meta, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_ = fresh.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := fresh.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a connection answered only ApiVersions, at shutdown: %v, want a reset", err)
	}
	_ = served.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := served.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a served connection, at shutdown: %v, want a plain close (EOF)", err)
	}
}
