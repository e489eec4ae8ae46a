package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// connections.max.idle.ms bounds a stall, not a slow transfer, of a frame
// the plain proxy streams (spliced) through: a 4 MiB acks=0 Produce sent
// over two idle periods, and a 16 MiB Fetch response read over three, at
// half an idle period per MiB, are not cut (a helper saw both cut at a 2 s bound: the splice left the
// idle clock and the write deadline where they were when the frame began).
// The proxy moves them per MiB (streamChunk).
func TestSlowFrameNotIdle(t *testing.T) {
	const idle = time.Second
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "33554432"}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), IdleTimeout: idle, Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := "p"
	metadata := func(corr int32) []byte {
		m := kmsg.NewPtrMetadataRequest()
		m.Version = 4
		return encodeRequest(m, corr, &id)
	}

	t.Run("produce", func(t *testing.T) {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks, req.TimeoutMillis = 9, 0, 30000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = "t"
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = seedBatch(0, string(randomValue(1, 4<<20)))
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		frame := encodeRequest(req, 1, &id)
		conn, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := time.Now()
		for len(frame) > 0 { // 512 KiB every idle/4
			k := min(len(frame), 512<<10)
			if _, err := conn.Write(frame[:k]); err != nil {
				t.Fatalf("after %v: %v", time.Since(start), err)
			}
			frame = frame[k:]
			time.Sleep(idle / 4)
		}
		if took := time.Since(start); took < 2*idle {
			t.Fatalf("the frame went in %v, not over two idle periods (%v): the test proves nothing", took, idle)
		}
		if _, err := conn.Write(metadata(2)); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		readResponse(t, conn, 2) // the connection was not cut
		if n := testutil.ToFloat64(s.m.idleClosed); n != 0 {
			t.Fatalf("%v connections closed as idle", n)
		}
	})

	t.Run("fetch", func(t *testing.T) {
		direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchMaxBytes(2<<20),
			kgo.ProducerBatchCompression(kgo.NoCompression()))
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close()
		for i := range 16 {
			if err := direct.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: randomValue(uint64(10+i), 1<<20)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		// A small receive buffer, so that the kernel's buffers do not
		// take the whole response at once.
		d := net.Dialer{}
		conn, err := d.DialContext(ctx, "tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.(*net.TCPConn).SetReadBuffer(64 << 10)
		if _, err := conn.Write(fetchV12Frame(1, "t", 32<<20)); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			t.Fatal(err)
		}
		n := int64(binary.BigEndian.Uint32(size[:]))
		if n < 16<<20 {
			t.Fatalf("a response of %d bytes, want the 16 MiB", n)
		}
		start := time.Now()
		for n > 0 { // 1 MiB every idle/4: over four idle periods
			k := min(n, 1<<20)
			if _, err := io.CopyN(io.Discard, conn, k); err != nil {
				t.Fatalf("%d bytes left after %v: %v (cut)", n, time.Since(start), err)
			}
			n -= k
			time.Sleep(idle / 4)
		}
		if took := time.Since(start); took < 3*idle {
			t.Fatalf("read in %v, not over three idle periods: the test proves nothing", took)
		}
		if testutil.ToFloat64(s.m.fetchStreamed) == 0 {
			t.Fatal("the response was not streamed through: the test proves nothing")
		}
		// (Once the proxy's last write is done, the connection is idle,
		// as the broker's would be, while the client drains its kernel
		// buffers: it may be closed after that, which is not tested.)
	})
}
