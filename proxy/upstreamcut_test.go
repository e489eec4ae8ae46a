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
)

// A broker connection that ends mid-response, inside a record set the
// plain proxy splices through, is the broker's fault: counted and logged
// as upstream_io, never client_io (a helper saw it as "write to client
// failed"), and the client's connection is reset without a complete frame.
func TestUpstreamCutMidRecordSet(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	for i := range 4 {
		if err := direct.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: randomValue(uint64(i), 900_000)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// A relay to the broker that ends each connection once 512 KiB of
	// the broker's bytes went through it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", c.ListenAddrs()[0])
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in) }()
				_, _ = io.CopyN(in, out, 512<<10)
			}()
		}
	}()
	s := startProxy(t, Config{Upstream: []string{ln.Addr().String()}, Logger: slog.New(slog.DiscardHandler)})
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(fetchV12Frame(1, "t", 8<<20)); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(conn)
	if len(got) >= 4 && len(got) >= 4+int(binary.BigEndian.Uint32(got)) {
		t.Fatalf("the client read a whole frame of %d bytes (and %v): want the connection ended before the cut response's end", len(got), err)
	}
	for testutil.ToFloat64(s.m.errors.WithLabelValues("upstream_io")) == 0 {
		if ctx.Err() != nil {
			t.Fatal("no upstream_io error counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("client_io")); n != 0 {
		t.Fatalf("the broker's cut counted as %v client_io", n)
	}
	if testutil.ToFloat64(s.m.fetchStreamed) == 0 {
		t.Fatal("the response was not streamed through: the test proves nothing")
	}
}
