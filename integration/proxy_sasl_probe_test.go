package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/proxy"
)

// seedRelay stands for a seed address of the cluster: it forwards to the
// real broker, or, while silent, accepts the proxy's SASL probe and
// answers it nothing (a seed broker that hangs, a load balancer in front of
// one), the other connections (the client's, the proxy's admin client's)
// being served.
type seedRelay struct {
	ln     net.Listener
	to     string
	silent atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newSeedRelay(t *testing.T, to string) *seedRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &seedRelay{ln: ln, to: to}
	t.Cleanup(r.close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			go r.serve(c)
		}
	}()
	return r
}

// serve forwards c to the broker unless the relay is silent and c's first
// request is a Metadata request: a connection of the proxy's SASL probe (a
// client's, and the proxy's admin client's, start with ApiVersions).
func (r *seedRelay) serve(c net.Conn) {
	var head [6]byte // size, api key
	if _, err := io.ReadFull(c, head[:]); err != nil {
		c.Close()
		return
	}
	if r.silent.Load() && binary.BigEndian.Uint16(head[4:]) == uint16(kmsg.Metadata) {
		return // held open, never answered
	}
	up, err := net.Dial("tcp", r.to)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	r.conns = append(r.conns, up)
	r.mu.Unlock()
	if _, err := up.Write(head[:]); err != nil {
		c.Close()
		up.Close()
		return
	}
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

func (r *seedRelay) close() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

// Whether the upstream listener requires SASL is learnt by a probe (a
// connection of the proxy's own that asks for Metadata unauthenticated).
// When the start-up probe could not conclude (the cluster unreachable as
// the proxy started), the first intercepted request probed, holding the
// client's request up to dial.timeout.ms and, when that probe failed too,
// closing the client's connection (fail closed), once per client: a seed
// that had become silent meanwhile cost every producer dial.timeout.ms and
// a reconnect, though the brokers served it. The proxy now probes again in
// the background until a probe concludes, so the answer is there before
// the clients' first produce.
func TestProxySASLProbeDoneAhead(t *testing.T) {
	real := realAddrs(t)[0]
	relay := newSeedRelay(t, real)
	relay.silent.Store(true) // the start-up probe gets no answer
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	cfg := proxy.Config{Upstream: []string{relay.ln.Addr().String()}, Listen: "127.0.0.1:0", DialTimeout: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Interceptors: []interceptor.Spec{{Name: "encrypt", Config: map[string]string{"topic.pattern": ".*",
			interceptor.KeyEncryptKeyURL: "base64key://" + base64.URLEncoding.EncodeToString(key)}}}}
	s, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err = s.Start(sctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	}()
	relay.silent.Store(false) // the seed answers again
	topic := newTopic(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.DefaultProduceTopic(topic), kgo.RecordDeliveryTimeout(20*time.Second),
		kgo.DisableIdempotentWrite()) // no InitProducerID, which may go to the seed
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// The client learns the brokers (through the seed); nothing is
	// intercepted yet.
	if _, err := kadm.NewClient(cl).Metadata(ctx, topic); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the background probe's time to conclude
	relay.silent.Store(true)    // the seed hangs the probe again; the brokers serve on
	start := time.Now()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the first intercepted produce took %v (dial.timeout.ms 3s): it waited for a SASL probe of a silent seed", d.Round(time.Millisecond))
	}
	t.Logf("first intercepted produce in %v", time.Since(start).Round(time.Millisecond))
}
