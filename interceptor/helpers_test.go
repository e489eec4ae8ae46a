package interceptor

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// funcIcpt is a test interceptor over a function, for both sides.
type funcIcpt struct {
	name string
	re   *regexp.Regexp
	fn   func(context.Context, *Record) error
}

func (f *funcIcpt) Name() string                                       { return f.name }
func (f *funcIcpt) TopicPattern() *regexp.Regexp                       { return f.re }
func (f *funcIcpt) ProcessRecord(ctx context.Context, r *Record) error { return f.fn(ctx, r) }

func icpt(t *testing.T, name, pattern string, fn func(context.Context, *Record) error) *funcIcpt {
	t.Helper()
	re, err := CompileTopicPattern(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return &funcIcpt{name: name, re: re, fn: fn}
}

var codecs = map[string]kgo.CompressionCodec{
	"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
	"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
}

// cluster is a kfake cluster whose produce requests pass through a chain
// first, as the proxy will run it.
type cluster struct {
	c        *kfake.Cluster
	mu       sync.Mutex
	chain    *Chain
	outcomes []ProduceOutcome
	// sent are copies of the (rewritten) produce requests kfake received.
	sent []*kmsg.ProduceRequest
	// orig are copies of the requests as the client sent them.
	orig []*kmsg.ProduceRequest
	ids  map[[16]byte]string
}

// names resolves topic ids, as the proxy does from Metadata: franz-go
// produces and fetches with topic ids (v13+) against kfake.
func (cl *cluster) names(id [16]byte) (string, bool) {
	n, ok := cl.ids[id]
	return n, ok
}

// use routes produce requests through a chain of instances.
func (cl *cluster) use(o Options, instances ...Instance) *Chain {
	o.TopicName = cl.names
	ch := NewChain(instances, o)
	cl.setChain(ch)
	return ch
}

func cloneProduce(r *kmsg.ProduceRequest) *kmsg.ProduceRequest {
	c := *r
	c.Topics = nil
	for _, t := range r.Topics {
		nt := t
		nt.Partitions = nil
		for _, p := range t.Partitions {
			p.Records = bytes.Clone(p.Records)
			nt.Partitions = append(nt.Partitions, p)
		}
		c.Topics = append(c.Topics, nt)
	}
	return &c
}

// newCluster starts kfake with the given topics (1 partition each; configs
// per topic) and routes produce requests through the chain.
func newCluster(t *testing.T, topics map[string]map[string]*string) *cluster {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	cl := &cluster{c: kc, ids: map[[16]byte]string{}}
	adm := kadm.NewClient(cl.client(t))
	for name, cfg := range topics {
		r, err := adm.CreateTopic(context.Background(), 1, 1, cfg, name)
		if err != nil {
			t.Fatal(err)
		}
		cl.ids[r.ID] = name
	}
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		cl.mu.Lock()
		chain := cl.chain
		cl.mu.Unlock()
		if chain == nil {
			return nil, nil, false
		}
		pr := req.(*kmsg.ProduceRequest)
		orig := cloneProduce(pr)
		out := chain.InterceptProduce(context.Background(), pr, func(_ context.Context, names []string) map[string]TopicLimit {
			m := map[string]TopicLimit{}
			for _, topic := range names {
				if v := topics[topic]["max.message.bytes"]; v != nil {
					var n int32
					for _, c := range *v {
						n = n*10 + int32(c-'0')
					}
					m[topic] = TopicLimit{MaxMessageBytes: n, Compression: derefOr(topics[topic]["compression.type"])}
				}
			}
			return m
		})
		cl.mu.Lock()
		cl.outcomes = append(cl.outcomes, out)
		cl.orig = append(cl.orig, orig)
		cl.sent = append(cl.sent, cloneProduce(pr))
		cl.mu.Unlock()
		if !out.Forward {
			if pr.Acks == 0 {
				return nil, nil, true
			}
			return out.Response(pr), nil, true
		}
		if len(out.Answered) > 0 {
			t.Errorf("test cluster cannot merge partial answers")
		}
		return nil, nil, false
	})
	return cl
}

func (cl *cluster) setChain(ch *Chain) {
	cl.mu.Lock()
	cl.chain = ch
	cl.mu.Unlock()
}

func (cl *cluster) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	c, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cl.c.ListenAddrs()...), kgo.ProducerLinger(50 * time.Millisecond),
		kgo.RecordRetries(2), kgo.RequestRetries(2), kgo.ProducerBatchMaxBytes(64 << 20), kgo.BrokerMaxWriteBytes(128 << 20)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// produceBatch produces recs as one batch (ProduceSync of several records
// lingers them into one batch per partition).
func produceBatch(t *testing.T, c *kgo.Client, recs ...*kgo.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := c.ProduceSync(ctx, recs...)
	errs := make([]error, len(res))
	for i, r := range res {
		errs[i] = r.Err
	}
	return errs
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// fetchRaw fetches topic's partition 0 from offset 0 with a raw Fetch
// request (topic id set, so both v12- and v13+ work).
func fetchRaw(t *testing.T, c *kgo.Client, topic string) (*kmsg.FetchResponse, [16]byte) {
	t.Helper()
	ctx := context.Background()
	md, err := kadm.NewClient(c).Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	id := md.Topics[topic].ID
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis = 10
	req.MaxBytes = 256 << 20
	req.IsolationLevel = 1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.PartitionMaxBytes = 256 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return resp, id
}

// records decodes a fetched partition as franz-go's consumer does (CRC
// checked, decompressed, control records and aborted data dropped).
func records(t *testing.T, topic string, p *kmsg.FetchResponseTopicPartition) []*kgo.Record {
	t.Helper()
	fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Topic: topic, Partition: p.Partition,
		IsolationLevel: kgo.ReadCommitted()}, p, kgo.DefaultDecompressor(), nil)
	if fp.Err != nil {
		t.Fatalf("franz-go rejects the fetched partition: %v", fp.Err)
	}
	return fp.Records
}

// checkBatches checks every batch in b: CRC-32C over the right bytes,
// length, record count and last offset delta as decoded by kmsg.
func checkBatches(t *testing.T, b []byte) []kmsg.RecordBatch {
	t.Helper()
	var out []kmsg.RecordBatch
	for len(b) > 0 {
		var rb kmsg.RecordBatch
		if err := rb.ReadFrom(b); err != nil {
			t.Fatalf("batch does not decode: %v", err)
		}
		n := 12 + int(rb.Length)
		if got := crc32.Checksum(b[21:n], crc32.MakeTable(crc32.Castagnoli)); got != uint32(rb.CRC) {
			t.Fatalf("CRC %08x, header %08x", got, uint32(rb.CRC))
		}
		d, err := decodeBatch(context.Background(), nil, b[:n])
		if err != nil {
			t.Fatalf("batch: %v", err)
		}
		if int(rb.NumRecords) != len(d.recs) {
			t.Fatalf("num records %d, decoded %d", rb.NumRecords, len(d.recs))
		}
		out = append(out, rb)
		b = b[n:]
	}
	return out
}

var errTest = errors.New("test failure")

// allTopics is a limits callback giving every topic max.message.bytes n.
func allTopics(n int32) func(context.Context, []string) map[string]TopicLimit {
	return func(_ context.Context, topics []string) map[string]TopicLimit {
		m := map[string]TopicLimit{}
		for _, t := range topics {
			m[t] = TopicLimit{MaxMessageBytes: n}
		}
		return m
	}
}

func derefOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// cpuTime is the process's user + system CPU time so far (a benchmark's
// cpu-ns/op: work spread over goroutines shows in it, not in ns/op).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
