package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// plainProxy is a proxy with no interceptors in front of a one-broker kfake
// cluster that has topic t (one partition).
func plainProxy(t *testing.T) (*Server, *kfake.Cluster) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(slog.DiscardHandler)}), c
}

// startProxy starts a proxy of cfg listening on a free loopback port (when
// cfg names none), shut down at the end of the test.
func startProxy(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
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

// produceV9Frame is a Produce v9 request frame of one batch of values for
// topic t, partition 0.
func produceV9Frame(corr int32, clientID string, acks int16, values ...string) []byte {
	return produceV9FrameTo("t", corr, clientID, acks, values...)
}

// produceV9FrameTo is produceV9Frame for topic.
func produceV9FrameTo(topic string, corr int32, clientID string, acks int16, values ...string) []byte {
	req := kmsg.NewPtrProduceRequest()
	req.Version = 9
	req.Acks = acks
	req.TimeoutMillis = 30000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = seedBatch(0, values...)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return encodeRequest(req, corr, &clientID)
}

// readResponse reads one response frame from conn and checks its
// correlation id.
func readResponse(t *testing.T, conn net.Conn, corr int32) []byte {
	t.Helper()
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		t.Fatalf("response to correlation id %d: %v", corr, err)
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(conn, body); err != nil {
		t.Fatalf("response to correlation id %d: %v", corr, err)
	}
	if got := int32(binary.BigEndian.Uint32(body)); got != corr {
		t.Fatalf("correlation id %d, want %d", got, corr)
	}
	return body
}

// checkProduced decodes a Produce v9 response body (past the correlation id
// and the tag byte of its flexible header) and checks it accepted t/0.
func checkProduced(t *testing.T, body []byte, corr int32) {
	t.Helper()
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 9
	if err := resp.ReadFrom(body[5:]); err != nil {
		t.Fatalf("Produce response %d: %v", corr, err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 || resp.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("Produce response %d: %+v", corr, resp.Topics)
	}
}

// TestProxyHeadReadAfterLargeFrames: after a frame larger than the read
// buffer streams through, the proxy reads only the head of the client's
// next frame and splices the rest (peekRequest). Requests whose header, or
// Produce acks, lie past that short read (a long client id), a small
// request, ApiVersions (answered after decoding), a run of small pipelined
// Produce requests (whose responses go out in one write, answerRun) and an
// acks=0 Produce all go through in order, one pipelined write, and every
// record lands on the broker as sent.
func TestProxyHeadReadAfterLargeFrames(t *testing.T) {
	s, c := plainProxy(t)
	conn, err := net.DialTimeout("tcp", s.Addr(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))

	large := func(i int) string { return strings.Repeat(string(rune('a'+i)), 100<<10) }
	longID := strings.Repeat("c", 2*headRead) // the header alone is longer than a head read
	var batch []byte
	var want []string
	type expect struct {
		corr    int32
		produce bool
	}
	var expects []expect
	corr := int32(1)
	add := func(frame []byte, produce bool, values ...string) {
		batch = append(batch, frame...)
		want = append(want, values...)
		expects = append(expects, expect{corr, produce})
		corr++
	}
	add(produceV9Frame(corr, "p", 1, large(0)), true, large(0))
	meta := kmsg.NewPtrMetadataRequest()
	meta.Version = 4
	add(encodeRequest(meta, corr, &longID), false)
	add(produceV9Frame(corr, "p", 1, large(1)), true, large(1))
	add(produceV9Frame(corr, longID, 1, large(2)), true, large(2))
	add(produceV9Frame(corr, "p", 1, large(3)), true, large(3))
	add(encodeRequest(kmsg.NewPtrApiVersionsRequest(), corr, &longID), false)
	add(produceV9Frame(corr, "p", 1, large(4)), true, large(4))
	for i := range 20 {
		v := fmt.Sprintf("small %d", i)
		add(produceV9Frame(corr, "p", 1, v), true, v)
	}
	// acks=0: no response; its record lands all the same.
	batch = append(batch, produceV9Frame(corr, "p", 0, large(5))...)
	want = append(want, large(5))
	corr++
	add(produceV9Frame(corr, "p", 1, "last"), true, "last")

	if _, err := conn.Write(batch); err != nil {
		t.Fatal(err)
	}
	for _, e := range expects {
		body := readResponse(t, conn, e.corr)
		if e.produce {
			checkProduced(t, body, e.corr)
		}
	}
	checkTopic(t, c, want)
}

// TestProxyHeadReadHostile: a client that sends a large frame and then a
// few bytes of the next one, or the next one's head a byte at a time, is
// handled like any client: the trickled frame is forwarded whole; the cut
// one closes that connection, and the proxy serves the next.
func TestProxyHeadReadHostile(t *testing.T) {
	s, c := plainProxy(t)
	dial := func() net.Conn {
		conn, err := net.DialTimeout("tcp", s.Addr(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
		return conn
	}
	big := strings.Repeat("b", 64<<10)

	// The next frame's head a byte at a time.
	conn := dial()
	defer conn.Close()
	if _, err := conn.Write(produceV9Frame(1, "p", 1, big)); err != nil {
		t.Fatal(err)
	}
	checkProduced(t, readResponse(t, conn, 1), 1)
	next := produceV9Frame(2, strings.Repeat("x", headRead), 1, big)
	for i := range 2 * headRead {
		if _, err := conn.Write(next[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Write(next[2*headRead:]); err != nil {
		t.Fatal(err)
	}
	checkProduced(t, readResponse(t, conn, 2), 2)

	// Three bytes of a size prefix, then the client goes: the proxy closes
	// the connection (the broker would too).
	cut := dial()
	defer cut.Close()
	if _, err := cut.Write(produceV9Frame(1, "p", 1, big)); err != nil {
		t.Fatal(err)
	}
	checkProduced(t, readResponse(t, cut, 1), 1)
	if _, err := cut.Write([]byte{0, 1, 0}); err != nil {
		t.Fatal(err)
	}
	_ = cut.(*net.TCPConn).CloseWrite()
	if n, err := cut.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes after a cut frame, want the connection closed", n)
	}

	// A frame cut after the head read: closed too.
	cut2 := dial()
	defer cut2.Close()
	if _, err := cut2.Write(produceV9Frame(1, "p", 1, big)); err != nil {
		t.Fatal(err)
	}
	checkProduced(t, readResponse(t, cut2, 1), 1)
	if _, err := cut2.Write(produceV9Frame(2, "p", 1, big)[:4*headRead]); err != nil {
		t.Fatal(err)
	}
	_ = cut2.(*net.TCPConn).CloseWrite()
	if n, err := cut2.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes after a cut frame, want the connection closed", n)
	}

	// The proxy serves the next connection.
	again := dial()
	defer again.Close()
	if _, err := again.Write(produceV9Frame(1, "p", 1, "after")); err != nil {
		t.Fatal(err)
	}
	checkProduced(t, readResponse(t, again, 1), 1)
	checkTopic(t, c, []string{big, big, big, big, "after"})
}

// checkTopic reads topic t straight from the cluster and checks it holds
// want's values, in order.
func checkTopic(t *testing.T, c *kfake.Cluster, want []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got []string
	for len(got) < len(want) {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d records of %d: %v", len(got), len(want), err)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if len(got) != len(want) {
		t.Fatalf("%d records on the broker, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal([]byte(got[i]), []byte(want[i])) {
			t.Fatalf("record %d: %d bytes %.20q, want %d bytes %.20q", i, len(got[i]), got[i], len(want[i]), want[i])
		}
	}
}
