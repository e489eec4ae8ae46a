package proxy

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"log/slog"
	"net"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/faultproxy"
)

// counting is a produce interceptor that counts the records it sees.
type counting struct{ n *atomic.Int64 }

func (c counting) Name() string                 { return "counting" }
func (c counting) TopicPattern() *regexp.Regexp { return regexp.MustCompile(`.*`) }
func (c counting) ProcessRecord(context.Context, *interceptor.Record) error {
	c.n.Add(1)
	return nil
}

var countingSeen atomic.Int64

func init() {
	interceptor.Register("test-counting", func(context.Context, map[string]string) (interceptor.Instance, error) {
		return interceptor.Instance{Produce: counting{&countingSeen}}, nil
	})
}

// produceFrame is a Produce v9 request frame of one record to topic.
func produceFrame(t *testing.T, topic string) []byte {
	t.Helper()
	rec := kmsg.Record{Value: []byte("v"), Headers: []kmsg.Header{}}
	body := rec.AppendTo(nil)[1:]
	recs := append(binary.AppendVarint(nil, int64(len(body))), body...)
	b := kmsg.RecordBatch{Magic: 2, LastOffsetDelta: 0, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: 1, Records: recs, Length: int32(49 + len(recs))}
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, 1, 1000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = b.AppendTo(nil)
	binary.BigEndian.PutUint32(rp.Records[17:], crc32.Checksum(rp.Records[21:], crc32.MakeTable(crc32.Castagnoli)))
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("t")).AppendRequest(nil, req, 1)
}

// An upstream the proxy could not reach at start, which turns out to close
// unauthenticated connections (a SASL listener) when it comes up, gets no
// interception for an unauthenticated client: while the upstream is
// unreachable the proxy fails closed, and its first probe finds the SASL
// listener.
func TestLateSASLUpstreamFailsClosed(t *testing.T) {
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := hold.Addr().String()
	hold.Close() // nothing listens there yet
	s, err := New(Config{Upstream: []string{addr}, Listen: "127.0.0.1:0", DialTimeout: time.Second,
		Interceptors: []interceptor.Spec{{Name: "test-counting"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	send := func() {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(produceFrame(t, "any")); err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		_, _ = c.Read(b[:]) // the connection closes, no answer
	}
	send() // upstream unreachable: fail closed
	if n := countingSeen.Load(); n != 0 {
		t.Fatalf("the interceptor saw %d records while the upstream could not be asked", n)
	}
	// Now a "SASL listener": it closes every connection unanswered.
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	send()
	if n := countingSeen.Load(); n != 0 {
		t.Fatalf("the interceptor saw %d records from an unauthenticated client of a SASL upstream", n)
	}
	if !s.saslKnown.Load() || !s.saslUpstream.Load() {
		t.Fatalf("the probe did not conclude the upstream requires SASL (known %v, sasl %v)", s.saslKnown.Load(), s.saslUpstream.Load())
	}
}

// A client that has not authenticated to a SASL upstream holds none of the
// memory budget with a Produce the interceptors would read whole: the
// connection is closed once the request's header is in, before its body is
// read (the broker caps unauthenticated requests too). Break review 2:
// six such clients, each trickling 95 MB, held the whole budget and an
// authenticated client's produce waited ten minutes.
func TestUnauthenticatedFrameHoldsNoMemory(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // a SASL listener, as the probe sees it: closes unauthenticated connections
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	s, err := New(Config{Upstream: []string{l.Addr().String()}, Listen: "127.0.0.1:0", DialTimeout: time.Second,
		Interceptors: []interceptor.Spec{{Name: "test-counting"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A Produce frame announcing 90 MB: its real start (header, topic),
	// then 8 MiB of its body, then nothing.
	frame := produceFrame(t, "any")
	binary.BigEndian.PutUint32(frame, 90<<20)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		var b [1]byte
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Read(b[:])
	}()
	_, _ = c.Write(frame)
	var peak int64
	chunk := make([]byte, 64<<10)
	for range 128 {
		if _, err := c.Write(chunk); err != nil {
			break // closed by the proxy
		}
		peak = max(peak, s.mem.InUse())
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection of an unauthenticated client sending a Produce stays open")
	}
	if peak > 1<<20 {
		t.Fatalf("an unauthenticated client's frame held %d bytes of the budget", peak)
	}
	if n := countingSeen.Load(); n != 0 {
		t.Fatalf("the interceptor saw %d records", n)
	}
}

// A client whose first intercepted request waits for a probe of the
// upstream (none concluded yet: the seed accepts and answers nothing) and
// that closes its connection meanwhile ends the wait: the connection does
// not stay open until the probe's dial.timeout.ms is up.
func TestSASLProbeWaitEndsWithClient(t *testing.T) {
	silent, err := faultproxy.NewSilent() // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	s, err := New(Config{Upstream: []string{silent.Addr()}, Listen: "127.0.0.1:0", DialTimeout: 8 * time.Second,
		Logger: slog.New(slog.DiscardHandler), Interceptors: []interceptor.Spec{{Name: "test-counting"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = s.Start(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(produceFrame(t, "any")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the request waits for the probe
	if conns(s) != 1 {
		t.Fatalf("%d connections, want the one waiting", conns(s))
	}
	c.Close()
	closed := time.Now()
	for conns(s) > 0 && time.Since(closed) < 5*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if n := conns(s); n > 0 {
		t.Fatalf("the connection is still open %v after its client closed, waiting for a probe of the upstream", time.Since(closed).Round(time.Millisecond))
	}
	t.Logf("the connection ended %v after its client closed", time.Since(closed).Round(time.Millisecond))
}
