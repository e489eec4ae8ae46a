package proxy

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
)

// A consumer that closes its connection with a fetch outstanding (Kafka's
// clients do on close: a helper saw it with confluent-kafka's
// Consumer.close) ends the connection as the broker sees it: the proxy's
// write of the response fails (EPIPE or ECONNRESET), the connection ends,
// logged at debug, and ferry_proxy_errors_total{kind="client_io"} does not
// count it. Both ways a response goes out: streamed as it arrives (no
// interceptors) and written whole after the chain (large-message).
func TestClientClosedWithFetchOutstanding(t *testing.T) {
	for _, tc := range []struct {
		name string
		ics  func(dir string) []interceptor.Spec
	}{
		{"plain", func(string) []interceptor.Spec { return nil }},
		{"large-message", func(dir string) []interceptor.Spec {
			return []interceptor.Spec{{Name: "large-message", Config: map[string]string{
				largemessage.KeyStoreURL: "file://" + dir, "topic.pattern": ".*"}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "big"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			logs := &logCounter{}
			s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(logs), Interceptors: tc.ics(t.TempDir())})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchCompression(kgo.NoCompression()))
			if err != nil {
				t.Fatal(err)
			}
			defer direct.Close()
			// 8 MB in the partition: far more than the sockets hold, so
			// the proxy is still writing the response when the client's
			// side answers it with a reset.
			for i := range 10 {
				if err := direct.ProduceSync(ctx, &kgo.Record{Topic: "big", Value: randomValue(uint64(i), 800_000)}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			for round := range 3 {
				conn, err := net.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Write(fetchV12Frame(int32(round+1), "big", 64<<20)); err != nil {
					t.Fatal(err)
				}
				_ = conn.Close() // nothing of the response read
			}
			const gone = "client closed the connection before its response was written"
			for logs.count(slog.LevelDebug, gone) < 3 {
				if n := logs.count(slog.LevelWarn, "write to client failed"); n != 0 {
					t.Fatalf("%d warnings for writes to clients that had closed", n)
				}
				if ctx.Err() != nil {
					t.Fatalf("%d of 3 connections ended by their client's close (want 3; the proxy's logs: %d warnings)", logs.count(slog.LevelDebug, gone), logs.count(slog.LevelWarn, ""))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if n := testutil.ToFloat64(s.m.errors.WithLabelValues("client_io")); n != 0 {
				t.Fatalf("ferry_proxy_errors_total{kind=\"client_io\"} = %v after clients closed with a fetch outstanding, want 0", n)
			}
			if n := logs.count(slog.LevelWarn, "write to client failed"); n != 0 {
				t.Fatalf("%d warnings for writes to clients that had closed", n)
			}
			// The proxy serves on.
			cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.ConsumeTopics("big"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			got := 0
			for got < 10 {
				fs := cl.PollFetches(ctx)
				if err := fs.Err(); err != nil {
					t.Fatal(err)
				}
				got += fs.NumRecords()
			}
		})
	}
}

// fetchV12Frame is a Fetch v12 request frame (flexible: a tagged-field
// section after the client id) for partition 0 of topic from offset 0,
// up to maxBytes.
func fetchV12Frame(corr int32, topic string, maxBytes int32) []byte {
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.MaxWaitMillis, req.MaxBytes = 12, 100, maxBytes
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.PartitionMaxBytes, rp.CurrentLeaderEpoch, rp.LogStartOffset = maxBytes, -1, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	frame := make([]byte, 4, 128)
	frame = binary.BigEndian.AppendUint16(frame, uint16(req.Key()))
	frame = binary.BigEndian.AppendUint16(frame, uint16(req.Version))
	frame = binary.BigEndian.AppendUint32(frame, uint32(corr))
	frame = append(frame, 0, 1, 't', 0) // client id "t", no tagged fields
	frame = req.AppendTo(frame)
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	return frame
}
