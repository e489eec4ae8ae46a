package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// These tests run the proxy in front of franz-go's in-process Kafka (kfake)
// for what one real broker cannot show: several brokers, a broker added
// later, partition leadership moving (KIP-951 endpoints in Produce
// responses). The real-broker tests are in integration/.

type recorder struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (r *recorder) dial(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &recConn{Conn: c, r: r}, nil
}

type recConn struct {
	net.Conn
	r *recorder
}

func (c *recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.r.b.Write(p[:n])
	c.r.mu.Unlock()
	return n, err
}

func freePort(t *testing.T, n int) int {
	t.Helper()
	// A base port whose next n ports are free now (best effort).
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if base+n > 65535 {
			continue
		}
		ok := true
		for i := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

func TestProxyBrokersDeterministicPortsAndLaterBrokers(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(4, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base := freePort(t, 8)
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", BrokerPortBase: base,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())

	rec := &recorder{}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.Dialer(rec.dial), kgo.DefaultProduceTopic("t"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	brokersIn := func() map[int32]int32 {
		t.Helper()
		m, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int32]int32{}
		for _, b := range m.Brokers {
			if b.Host != "127.0.0.1" {
				t.Fatalf("broker %d host %q, want the proxy's 127.0.0.1", b.NodeID, b.Host)
			}
			out[b.NodeID] = b.Port
		}
		return out
	}
	got := brokersIn()
	if len(got) != 2 {
		t.Fatalf("brokers %v, want 2", got)
	}
	for id, port := range got {
		if port != int32(base)+id {
			t.Fatalf("broker %d on port %d, want broker.port.base+id = %d", id, port, base+int(id))
		}
	}

	// A broker added later gets its listener on the next Metadata.
	newID, _, err := c.AddNode(-1, 0)
	if err != nil {
		t.Fatal(err)
	}
	got = brokersIn()
	if got[newID] != int32(base)+newID {
		t.Fatalf("added broker %d: port %d in %v, want %d", newID, got[newID], got, base+int(newID))
	}
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+int(newID))))
	if err != nil {
		t.Fatalf("no listener for the added broker: %v", err)
	}
	conn.Close()

	// Leadership moves: the old leader answers NOT_LEADER_OR_FOLLOWER with
	// the new leader's endpoint (KIP-951), which the proxy rewrites.
	produce := func(v string) {
		t.Helper()
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce("before")
	leader := c.LeaderFor("t", 0)
	target := (leader + 1) % 2
	if err := c.MoveTopicPartition("t", 0, target); err != nil {
		t.Fatal(err)
	}
	produce("after")
	if n := testutil.ToFloat64(s.m.rewrites.WithLabelValues("Metadata")); n < 2 {
		t.Fatalf("Metadata rewrites counted %v", n)
	}
	if n := testutil.ToFloat64(s.m.rewrites.WithLabelValues("Produce")); n < 1 {
		t.Fatalf("no Produce response with KIP-951 endpoints was rewritten (%v)", n)
	}

	// No byte the client received names a kfake port.
	rec.mu.Lock()
	seen := rec.b.Bytes()
	for _, a := range append(c.ListenAddrs(), "") {
		_, p, _ := net.SplitHostPort(a)
		port, _ := strconv.Atoi(p)
		if port == 0 {
			continue
		}
		if bytes.Contains(seen, []byte(p)) || bytes.Contains(seen, binary.BigEndian.AppendUint32(nil, uint32(port))) {
			t.Errorf("the client received the real port %d", port)
		}
	}
	rec.mu.Unlock()
}

// Without broker.port.base, node id N listens on the bootstrap port + 1 + N,
// and a restarted proxy hands out the same addresses.
func TestProxyDefaultBrokerPortsSurviveRestart(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := freePort(t, 4)
	listen := "127.0.0.1:" + strconv.Itoa(p)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ports := func() map[int32]int32 {
		s, err := New(Config{Upstream: c.ListenAddrs(), Listen: listen, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer s.Shutdown(context.Background())
		cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		m, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int32]int32{}
		for _, b := range m.Brokers {
			out[b.NodeID] = b.Port
		}
		return out
	}
	first := ports()
	if len(first) != 2 {
		t.Fatalf("brokers %v", first)
	}
	for id, port := range first {
		if port != int32(p)+1+id {
			t.Fatalf("node %d on port %d, want listen port + 1 + id = %d", id, port, p+1+int(id))
		}
	}
	second := ports()
	for id, port := range first {
		if second[id] != port {
			t.Fatalf("after a restart node %d is on %d, was %d", id, second[id], port)
		}
	}
}

// connections.max.idle.ms: a connection with nothing in flight and no frame
// for that long is closed (a stalled half frame counts as idle), a busy one
// is not.
func TestProxyIdleTimeout(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", IdleTimeout: 800 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	dial := func() net.Conn {
		cn, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cn.Close() })
		return cn
	}
	apiVersions := []byte{0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff}
	roundTrip := func(cn net.Conn) error {
		if _, err := cn.Write(apiVersions); err != nil {
			return err
		}
		_ = cn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var size [4]byte
		if _, err := io.ReadFull(cn, size[:]); err != nil {
			return err
		}
		_, err := io.CopyN(io.Discard, cn, int64(binary.BigEndian.Uint32(size[:])))
		return err
	}
	closedWithin := func(cn net.Conn, d time.Duration) bool {
		_ = cn.SetReadDeadline(time.Now().Add(d))
		_, err := cn.Read(make([]byte, 1))
		ne, ok := err.(net.Error)
		return err != nil && !(ok && ne.Timeout())
	}

	half := dial()
	if _, err := half.Write(apiVersions[:6]); err != nil { // a frame that never completes
		t.Fatal(err)
	}
	idle := dial()
	if err := roundTrip(idle); err != nil {
		t.Fatal(err)
	}
	busy := dial()
	for range 20 { // 2 s of traffic, well past the idle timeout
		if err := roundTrip(busy); err != nil {
			t.Fatalf("a busy connection was closed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !closedWithin(half, 3*time.Second) {
		t.Fatal("a stalled half frame kept its connection open")
	}
	if !closedWithin(idle, 3*time.Second) {
		t.Fatal("an idle connection stayed open")
	}
	if n := testutil.ToFloat64(s.m.idleClosed); n < 2 {
		t.Fatalf("idle closes counted: %v", n)
	}
}

// A bootstrap connection goes to the next upstream seed when one does not
// answer; the failed dial is counted.
func TestProxySeedFailover(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, err := New(Config{Upstream: []string{dead, c.ListenAddrs()[0]}, Listen: "127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	for i := range 4 { // the seed index rotates: some of these try the dead seed first
		cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		cl.Close()
	}
	if n := testutil.ToFloat64(s.m.upstreamConnects.WithLabelValues("error")); n < 1 {
		t.Fatalf("no failed upstream dial counted (%v)", n)
	}
}
