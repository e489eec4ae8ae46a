package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A consumer killed (or closed with SO_LINGER 0) while the proxy splices
// its Fetch response resets the connection with a response owed: the
// broker sees a plain disconnect, and so must the proxy (debug, not
// client_io), whichever of its reader and writer meets the reset first
// (found by a helper: a killed Java consumer counted as client_io "write to
// client failed ... splice: connection reset by peer", 2 of 14 kills on a
// proxy without interceptors).
func TestClientResetMidFetchResponse(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	v := bytes.Repeat([]byte("v"), 100<<10)
	for range 8 { // 8 batches of 8 records of 100 KiB: a 6.4 MiB Fetch response
		var rs []*kgo.Record
		for range 8 {
			rs = append(rs, &kgo.Record{Value: v})
		}
		if err := cl.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl.Close()
	logs := &logCounter{}
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(logs)})
	clientIO := func() float64 { return testutil.ToFloat64(s.m.errors.WithLabelValues("client_io")) }

	req := kmsg.NewPtrFetchRequest()
	req.Version = 12
	req.ReplicaID, req.MaxWaitMillis, req.MaxBytes, req.SessionEpoch = -1, 100, 50<<20, -1
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = "t"
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.PartitionMaxBytes, fp.CurrentLeaderEpoch, fp.LastFetchedEpoch, fp.LogStartOffset = 50<<20, -1, -1, -1
	ft.Partitions = append(ft.Partitions, fp)
	req.Topics = append(req.Topics, ft)
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID("t")).AppendRequest(nil, req, 1)

	const rounds = 30
	for range rounds {
		conn := dialLinger0(t, s.Addr())
		if _, err := conn.Write(frame); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
		_ = conn.Close() // a reset, most of the response unread
	}
	deadline := time.Now().Add(10 * time.Second)
	conns := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	for conns() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := clientIO(); n != 0 {
		t.Fatalf("ferry_proxy_errors_total{kind=\"client_io\"} = %v after %d clients reset their connection with a Fetch response owed, want 0 (%d warnings)",
			n, rounds, logs.count(slog.LevelWarn, ""))
	}
}
