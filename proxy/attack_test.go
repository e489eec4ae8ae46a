package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// bothProxy is a proxy with large-message on produce and fetch (values
// over 1 MiB streamed both ways) from a file store, in front of kfake with
// topics big and other, and the store.
func bothProxy(t *testing.T) (*Server, *kfake.Cluster, payloadstore.PayloadStore) {
	return bothProxyConfig(t, nil, nil)
}

// bothProxyConfig is bothProxy with more large-message keys and a change
// to the proxy's Config.
func bothProxyConfig(t *testing.T, lm map[string]string, cfg func(*Config)) (*Server, *kfake.Cluster, payloadstore.PayloadStore) {
	t.Helper()
	dir := t.TempDir()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "big", "other"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	keys := map[string]string{largemessage.KeyStoreURL: "file://" + dir, "topic.pattern": ".*",
		interceptor.KeyStreamThreshold: "1048576"}
	for k, v := range lm {
		keys[k] = v
	}
	config := Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{{Name: "large-message", Config: keys}}}
	if cfg != nil {
		cfg(&config)
	}
	s, err := New(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	store, err := payloadstore.Open(context.Background(), "file://"+dir, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s, c, store
}

// A client that produces, through the proxy, a reference to an object of
// its own topic with a forged ferry.payload.crc32c header must not make
// the partition unreadable for other consumers: the fetch streams the
// payload and its CRC-32C check closes every consumer's connection.
func TestAttackForgedPayloadCRC(t *testing.T) {
	s, c, store := bothProxy(t)
	ser := largemessage.NewSerializer(store, largemessage.Codec{Type: "none"})
	value := randomValue(7, 3<<20)
	// A legitimate record, offloaded by the Go library.
	rec := &kgo.Record{Topic: "big", Value: value}
	if _, err := ser.Offload(context.Background(), rec, largemessage.DeriveLimits(1<<20, 1<<20, 0)); err != nil {
		t.Fatal(err)
	}
	if _, ok := largemessage.PayloadCRC32C(rec); !ok {
		t.Skip("the serializer writes no ferry.payload.crc32c header")
	}
	forged := &kgo.Record{Topic: "big", Value: append([]byte(nil), rec.Value...)}
	for _, h := range rec.Headers {
		if h.Key == largemessage.HeaderPayloadCRC32C {
			crc, _ := largemessage.PayloadCRC32C(rec)
			h.Value = fmt.Appendf(nil, "%08x", crc^1)
			t.Logf("real crc %08x, forged %s", crc, h.Value)
		}
		forged.Headers = append(forged.Headers, h)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), forged).FirstErr(); err != nil {
		t.Logf("the forged record was refused: %v", err)
		return
	}
	raw := consume(t, c.ListenAddrs()[0], "big", 1, 15*time.Second)
	for _, r := range raw {
		for _, h := range r.Headers {
			t.Logf("stored header %s=%q", h.Key, h.Value)
		}
	}
	got := consume(t, s.Addr(), "big", 1, 15*time.Second)
	if len(got) != 1 {
		t.Fatalf("a forged ferry.payload.crc32c header made the partition unreadable: consumed %d records", len(got))
	}
	if !bytes.Equal(got[0].Value, value) {
		t.Fatalf("consumed %d bytes, not the payload", len(got[0].Value))
	}
}

// A streamed Produce frame holds its arena while it waits for more of
// proxy.memory.max.bytes (the value's upload buffers, the frame written
// again): when what it holds plus what it waits for exceeds the budget,
// the wait can never end, and the connection hangs holding its share.
// It must fail at once instead (the budget is smaller than this request
// needs), as a frame over the budget does.
func TestAttackStreamMemorySelfDeadlock(t *testing.T) {
	env, store, _ := streamEnv(t, 200)
	env.mem = interceptor.NewMemory(40 << 20)
	lm := env.streamer("lm")
	env.streamer = func(topic string) interceptor.ValueStreamer {
		if topic == "plain" {
			return nil
		}
		return lm
	}
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks = 9, -1
	plain := kmsg.NewProduceRequestTopic()
	plain.Topic = "plain"
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = batchOf(kmsg.Record{Value: bytes.Repeat([]byte("p"), 12<<20)})
	plain.Partitions = append(plain.Partitions, pp)
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "lm"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batchOf(kmsg.Record{Value: bytes.Repeat([]byte("v"), 100_000)})
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, plain, rt)
	frame := streamedProduceFrame(req)
	if int64(len(frame)) > env.mem.Limit() {
		t.Fatal("the frame is over the budget: readWhole would refuse it too")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env.ctx = ctx
	start := time.Now()
	out, release, streams, err := readStreamFrame(t, env, frame)
	if ctx.Err() != nil {
		t.Fatalf("the frame waited %s for memory it can never get (%d of %d bytes held by itself)", time.Since(start).Round(time.Second), env.mem.InUse(), env.mem.Limit())
	}
	if err == nil {
		_ = out
		streams.AbortUncommitted(context.Background())
		release()
	}
	t.Logf("err: %v", err)
	if n := env.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes held", n)
	}
	if n := storeObjects(t, store, "lm"); n != 0 {
		t.Fatalf("%d objects left", n)
	}
}

// Fetch limits smaller than a streamed value (Kafka returns the first
// batch whole anyway), several streamed values in one response, and a
// value exactly at the threshold (read into memory) all reach the
// consumer byte for byte, and the budget returns to 0.
func TestAttackStreamFetchLimits(t *testing.T) {
	s, c, ser := streamProxy(t)
	values := [][]byte{randomValue(11, 1<<20), randomValue(12, 1<<20+1), randomValue(13, 2<<20), randomValue(14, 3<<20)}
	produceOffloaded(t, c, ser, "other", values...)
	for _, lim := range []int32{1, 64 << 10, 64 << 20} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ConsumeTopics("other"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxBytes(lim), kgo.FetchMaxPartitionBytes(lim))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var got []*kgo.Record
		for len(got) < len(values) && ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
		}
		cancel()
		cl.Close()
		if len(got) != len(values) {
			t.Fatalf("fetch limit %d: consumed %d records, want %d", lim, len(got), len(values))
		}
		for i, r := range got {
			if !bytes.Equal(r.Value, values[i]) {
				t.Fatalf("fetch limit %d: record %d: %d bytes differ", lim, i, len(r.Value))
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.mem.InUse() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of the budget held", n)
	}
}

// cutConn closes itself once it has read after bytes: a consumer that
// goes away mid-stream.
type cutConn struct {
	net.Conn
	left *atomic.Int64
}

func (c cutConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.left.Add(-int64(n)) < 0 {
		c.Conn.Close()
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// A consumer that closes its connection in the middle of a streamed value
// leaves nothing held: the budget returns to 0 and the proxy's goroutines
// to what they were.
func TestAttackStreamFetchClosedMidValue(t *testing.T) {
	s, c, ser := streamProxy(t)
	produceOffloaded(t, c, ser, "other", randomValue(21, 6<<20), randomValue(22, 6<<20))
	before := runtime.NumGoroutine()
	for _, cut := range []int64{3 << 20, 7 << 20} {
		left := &atomic.Int64{}
		left.Store(cut)
		var d net.Dialer
		cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ConsumeTopics("other"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(64<<20),
			kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
				conn, err := d.DialContext(ctx, network, host)
				if err != nil {
					return nil, err
				}
				return cutConn{Conn: conn, left: left}, nil
			}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for left.Load() > 0 && ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
		cancel()
		cl.Close()
		if left.Load() > 0 {
			t.Fatalf("cut at %d: the consumer never read that far", cut)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for (s.mem.InUse() != 0 || runtime.NumGoroutine() > before+5) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := s.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of the budget held after consumers went away mid-stream", n)
	}
	if n := runtime.NumGoroutine(); n > before+5 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	// The proxy still serves.
	if got := consume(t, s.Addr(), "other", 2, 30*time.Second); len(got) != 2 {
		t.Fatalf("after the cut consumers: %d records", len(got))
	}
}

// acks=0 and transactional Produce requests with a streamed value: the
// proxy answers only when asked, the value is published (the broker may
// have written the record: it must stay readable) and reads back whole.
func TestAttackStreamProduceAcks0(t *testing.T) {
	s, _, store := bothProxy(t)
	value := randomValue(31, 3<<20)
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite(), kgo.ProducerBatchMaxBytes(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "big", Value: value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := consume(t, s.Addr(), "big", 1, 30*time.Second)
	if len(got) != 1 || !bytes.Equal(got[0].Value, value) {
		t.Fatalf("acks=0: consumed %d records", len(got))
	}
	if n := storeObjects(t, store, "big"); n != 1 {
		t.Fatalf("%d objects in the store, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.mem.InUse() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of the budget held", n)
	}
}

// A client that stalls in the middle of a streamed value, while others
// stream values under a budget with room for one upload at a time: the
// stalled connection is closed after the stall timeout, its upload leaves
// nothing in the store, the others' values are all produced, and the
// budget returns to 0.
func TestAttackStreamStallWithOthers(t *testing.T) {
	s, _, store := bothProxyConfig(t, map[string]string{largemessage.KeyStoreTimeout: "2000"}, func(c *Config) {
		c.MemoryMax, c.MaxRequestBytes = 40<<20, 8<<20
	})
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks = 9, -1
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "big"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batchOf(kmsg.Record{Value: randomValue(41, 3<<20)})
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	frame := streamedProduceFrame(req)
	stalled, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if _, err := stalled.Write(frame[:len(frame)/2]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	values := make([][]byte, 4)
	errs := make(chan error, len(values))
	for i := range values {
		values[i] = randomValue(uint64(50+i), 3<<20)
		go func() {
			cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ProducerBatchCompression(kgo.NoCompression()),
				kgo.ProducerBatchMaxBytes(8<<20-1024))
			if err != nil {
				errs <- err
				return
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errs <- cl.ProduceSync(ctx, &kgo.Record{Topic: "big", Value: values[i]}).FirstErr()
		}()
	}
	for range values {
		if err := <-errs; err != nil {
			t.Fatalf("a producer beside the stalled client: %v", err)
		}
	}
	_ = stalled.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := stalled.Read(make([]byte, 1)); err == nil {
		t.Fatal("the stalled client got an answer")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the stalled client's connection still open after %s", time.Since(start).Round(time.Second))
	}
	got := consume(t, s.Addr(), "big", len(values), 30*time.Second)
	if len(got) != len(values) {
		t.Fatalf("consumed %d records, want %d", len(got), len(values))
	}
	deadline := time.Now().Add(10 * time.Second)
	for (s.mem.InUse() != 0 || storeObjects(t, store, "big") != len(values)) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := s.mem.InUse(); n != 0 {
		t.Fatalf("%d bytes of the budget held", n)
	}
	if n := storeObjects(t, store, "big"); n != len(values) {
		t.Fatalf("%d objects in the store, want %d (the stalled upload's must be gone)", n, len(values))
	}
}

// streamedFrameOf is a Produce v9 frame (after its prefix: size bytes) of
// one record of topic big whose value makes the frame's size exactly size.
func streamedFrameOf(t *testing.T, size int) []byte {
	t.Helper()
	value := randomValue(uint64(size), size)
	build := func(n int) []byte {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks = 9, -1
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = "big"
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = batchOf(kmsg.Record{Value: value[:n]})
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		return streamedProduceFrame(req)
	}
	n := size - 200
	n -= len(build(n)) - 4 - size // the varints' lengths do not change near there
	for ; n > size-300; n-- {
		if f := build(n); len(f)-4 == size {
			return f
		}
	}
	t.Fatalf("no frame of %d bytes", size)
	return nil
}

// Streamed frames pipelined on one connection are all answered, in order;
// one of exactly socket.request.max.bytes is read, one byte more closes
// the connection, and nothing is left in the store for it.
func TestAttackStreamPipelinedAndMaxRequest(t *testing.T) {
	const maxReq = 4 << 20
	s, _, store := bothProxyConfig(t, nil, func(c *Config) { c.MaxRequestBytes = maxReq })
	at := streamedFrameOf(t, maxReq)
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pipelined := append(append(append([]byte(nil), at...), at...), at...)
	go conn.Write(pipelined)
	_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	for i := range 3 {
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(conn, body); err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = 9
		if err := resp.ReadFrom(body[5:]); err != nil { // (correlation id, flexible header tags)
			t.Fatalf("response %d: %v", i, err)
		}
		if ec := resp.Topics[0].Partitions[0].ErrorCode; ec != 0 {
			t.Fatalf("response %d: error %d", i, ec)
		}
	}
	if n := storeObjects(t, store, "big"); n != 3 {
		t.Fatalf("%d objects, want 3", n)
	}
	over := streamedFrameOf(t, maxReq+1)
	conn2, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	go conn2.Write(over)
	_ = conn2.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn2.Read(make([]byte, 1)); err == nil {
		t.Fatal("a frame over socket.request.max.bytes was answered")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a frame over socket.request.max.bytes: the connection stays open")
	}
	if n := storeObjects(t, store, "big"); n != 3 {
		t.Fatalf("%d objects after the frame over the limit, want 3", n)
	}
}

// A threshold too small for the reference record (README:
// large.message.threshold.bytes) refuses the record whether its value is
// streamed to the store (over large.message.stream.threshold.bytes) or
// offloaded from memory: MESSAGE_TOO_LARGE both ways, nothing left in the
// store, and a record that fits inline still goes through.
func TestAttackThresholdBelowReferenceStreamed(t *testing.T) {
	s, _, store := bothProxyConfig(t, map[string]string{largemessage.KeyThreshold: "200"}, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(8<<20), kgo.RecordRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, n := range []int{512 << 10, 3 << 20} { // held in memory; streamed (over 1 MiB)
		err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "big", Value: randomValue(uint64(n), n)}).FirstErr()
		if !errors.Is(err, kerr.MessageTooLarge) {
			t.Fatalf("a %d-byte value with threshold 200: %v, want MESSAGE_TOO_LARGE", n, err)
		}
	}
	if n := storeObjects(t, store, "big"); n != 0 {
		t.Fatalf("%d objects in the store after refused records, want 0", n)
	}
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "big", Value: []byte("small")}).FirstErr(); err != nil {
		t.Fatalf("a 5-byte value: %v", err)
	}
}
