package proxy

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

var heldSeen atomic.Int64

func init() {
	interceptor.Register("test-held-counting", func(_ context.Context, _ map[string]string) (interceptor.Instance, error) {
		return interceptor.Instance{Produce: counting{&heldSeen}}, nil
	})
}

// bigProduceFrame is a Produce v9 request frame of one record of n bytes.
func bigProduceFrame(topic string, n int) []byte {
	rec := kmsg.Record{Value: make([]byte, n), Headers: []kmsg.Header{}}
	body := rec.AppendTo(nil)[1:]
	recs := append(binary.AppendVarint(nil, int64(len(body))), body...)
	b := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
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

// A client whose first request is a large Produce while the upstream
// broker is down (restarting) is held before the request is read whole:
// it holds none of proxy.memory.max.bytes meanwhile (held connections
// would otherwise starve every other connection's large requests for
// upstream.connect.timeout.ms), and the interceptors do not run (nor
// publish payloads) for a request that may never be forwarded.
func TestUpstreamDownHeldProduceHoldsNoBudget(t *testing.T) {
	s := startHeldProxy(t, Config{Upstream: []string{deadAddr(t)}, ConnectTimeout: 3 * time.Second,
		Interceptors: []interceptor.Spec{{Name: "test-held-counting"}}})
	// The broker was reached at start (no SASL), then went down.
	s.saslKnown.Store(true)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := heldSeen.Load()
	if _, err := c.Write(bigProduceFrame("t", 256<<10)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // held: the broker is still down
	if n := s.mem.InUse(); n != 0 {
		t.Errorf("a held Produce holds %d bytes of the memory budget", n)
	}
	if n := heldSeen.Load() - before; n != 0 {
		t.Errorf("the interceptors ran on %d records of a request held for an unreachable broker", n)
	}
}
