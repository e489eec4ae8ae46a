package proxy

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// apiVersionsV3Frame is an ApiVersions v3 request frame.
func apiVersionsV3Frame(corr int32) []byte {
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "ferry-test", "1.0.0"
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("t")).AppendRequest(nil, req, corr)
}

// askApiVersions sends an ApiVersions request on conn and checks its answer.
func askApiVersions(t *testing.T, conn net.Conn, corr int32) {
	t.Helper()
	if _, err := conn.Write(apiVersionsV3Frame(corr)); err != nil {
		t.Fatal(err)
	}
	body := readResponse(t, conn, corr)
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 3
	if err := resp.ReadFrom(body[4:]); err != nil || resp.ErrorCode != 0 || len(resp.ApiKeys) == 0 {
		t.Fatalf("ApiVersions response %d: error code %d, %d keys, %v", corr, resp.ErrorCode, len(resp.ApiKeys), err)
	}
}

// dialLinger0 connects to addr with SO_LINGER 0: its Close is a TCP reset,
// as librdkafka's clients and killed processes close.
func dialLinger0(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tc := c.(*net.TCPConn)
	if err := tc.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	_ = tc.SetDeadline(time.Now().Add(30 * time.Second))
	return tc
}

// A client that resets its connection between requests (SO_LINGER 0: a
// confluent-kafka client's close, a killed process) ends it as the broker
// sees it: logged at debug, not counted in
// ferry_proxy_errors_total{kind="client_io"}, and the proxy serves the next
// connection. A reset with part of a request read is client_io, "client
// disconnected mid-request", as a FIN there is.
func TestClientResetBetweenRequests(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	logs := &logCounter{}
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(logs)})
	clientIO := func() float64 { return testutil.ToFloat64(s.m.errors.WithLabelValues("client_io")) }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s (client_io %v; %d warnings)", what, clientIO(), logs.count(slog.LevelWarn, ""))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Between requests: two answered, then the reset.
	first := dialLinger0(t, s.Addr())
	askApiVersions(t, first, 1)
	askApiVersions(t, first, 2)
	_ = first.Close()
	waitFor("the reset seen by the proxy", func() bool {
		return logs.count(slog.LevelDebug, "client reset the connection") == 1 || clientIO() != 0
	})
	if n := clientIO(); n != 0 {
		t.Fatalf("ferry_proxy_errors_total{kind=\"client_io\"} = %v after a client reset its connection between requests, want 0", n)
	}
	if n := logs.count(slog.LevelWarn, ""); n != 0 {
		t.Fatalf("%d warnings after a client reset its connection between requests", n)
	}

	// The proxy serves a new connection.
	next := dialLinger0(t, s.Addr())
	askApiVersions(t, next, 1)

	// Mid-request: the head of a Metadata request read by the proxy, then
	// the reset.
	req := kmsg.NewPtrMetadataRequest()
	req.Version = 12
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("t")).AppendRequest(nil, req, 2)
	var cn *conn
	waitFor("the proxy's side of the connection", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for x := range s.conns {
			if x.client.RemoteAddr().String() == next.LocalAddr().String() {
				cn = x
			}
		}
		return cn != nil
	})
	before := time.Now().UnixNano()
	if _, err := next.Write(frame[:6]); err != nil { // size prefix and API key
		t.Fatal(err)
	}
	waitFor("the head of the request read", func() bool { return cn.active.Load() > before })
	_ = next.Close()
	// (fail counts, then logs)
	waitFor("the reset mid-request logged", func() bool { return logs.count(slog.LevelWarn, "") == 1 })
	if n := logs.count(slog.LevelWarn, "client disconnected mid-request"); n != 1 || clientIO() != 1 {
		t.Fatalf("%d warnings \"client disconnected mid-request\", client_io %v; want 1 and 1", n, clientIO())
	}
	if n := logs.count(slog.LevelDebug, "client reset the connection"); n != 1 {
		t.Fatalf("%d debug lines \"client reset the connection\", want 1 (the reset between requests)", n)
	}

	// And the proxy still serves.
	last := dialLinger0(t, s.Addr())
	defer last.Close()
	askApiVersions(t, last, 1)
}
