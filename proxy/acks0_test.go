package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// An acks=0 Produce request of which an interceptor refuses a partition
// closes the connection, as the broker closes it on an error with acks=0
// (KafkaApis.handleProduceRequest): the producer expects no response, so
// the close is its only signal. The partitions not refused are forwarded
// and land; a request nothing refused keeps the connection serving.
func TestAcks0RefusedClosesConnection(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t", "u"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Interceptors: []interceptor.Spec{
		{Name: "validate-json", Config: map[string]string{"topic.pattern": "t"}}}})
	produce := func(corr int32, values map[string]string) []byte {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks, req.TimeoutMillis = 9, 0, 30000
		for _, topic := range []string{"t", "u"} {
			v, ok := values[topic]
			if !ok {
				continue
			}
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = topic
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Records = seedBatch(0, v)
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		id := "p"
		return encodeRequest(req, corr, &id)
	}
	metadata := func(corr int32) []byte {
		id := "p"
		m := kmsg.NewPtrMetadataRequest()
		m.Version = 4
		return encodeRequest(m, corr, &id)
	}
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		return conn
	}

	// Nothing refused: the connection serves on.
	ok := dial()
	if _, err := ok.Write(append(produce(1, map[string]string{"t": `{"a":1}`}), metadata(2)...)); err != nil {
		t.Fatal(err)
	}
	readResponse(t, ok, 2)

	// t refused (not JSON), u forwarded: no answer to the Metadata request
	// that follows, the connection closed.
	bad := dial()
	if _, err := bad.Write(append(produce(1, map[string]string{"t": "not json", "u": `{"b":2}`}), metadata(2)...)); err != nil {
		t.Fatal(err)
	}
	closed(t, bad, "after an acks=0 Produce with a partition refused")
	// The same with every partition refused.
	all := dial()
	if _, err := all.Write(append(produce(1, map[string]string{"t": "not json"}), metadata(2)...)); err != nil {
		t.Fatal(err)
	}
	closed(t, all, "after an acks=0 Produce refused whole")

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t", "u"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := map[string][]string{}
	for len(got["t"])+len(got["u"]) < 2 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("records read: %v; want t's valid one and u's", got)
		}
		fs.EachRecord(func(r *kgo.Record) { got[r.Topic] = append(got[r.Topic], string(r.Value)) })
	}
	if len(got["t"]) != 1 || got["t"][0] != `{"a":1}` || len(got["u"]) != 1 || got["u"][0] != `{"b":2}` {
		t.Fatalf("records: %v; want t's valid one and u's forwarded one", got)
	}
}

// closed fails the test unless conn's next read finds it closed (an end
// or a reset, not a response nor the read deadline).
func closed(t *testing.T, conn net.Conn, when string) {
	t.Helper()
	var b [1]byte
	n, err := conn.Read(b[:])
	var ne net.Error
	if n != 0 || err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: read %d bytes, %v; want the connection closed", when, n, err)
	}
	if !errors.Is(err, io.EOF) {
		t.Logf("%s: %v", when, err)
	}
}

// An acks=0 Produce request whose client closes right after sending it is
// still intercepted and forwarded, as the broker would append it (a helper
// lost 20 records of 1 MB: the watch on the client's socket cancelled the
// interceptors when it closed).
func TestAcks0ClientClosesAtOnce(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "67108864"}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Interceptors: []interceptor.Spec{
		{Name: "validate-json", Config: map[string]string{"topic.pattern": "t"}}}})
	values := make([]string, 20)
	for i := range values {
		values[i] = fmt.Sprintf(`{"i":%d,"v":%q}`, i, strings.Repeat("x", 1<<20))
	}
	frame := produceV9Frame(1, "p", 0, values...)
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	checkTopic(t, c, values)
}
