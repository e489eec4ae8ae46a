package wasm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/wasm/abi"
)

// batches produces values as one record batch to a kfake cluster and
// returns the batch's bytes as the broker stored them (idempotent: with a
// producer id), for feeding the chain's produce and fetch paths.
func batches(t testing.TB, idempotent bool, values ...string) []byte {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	opts := []kgo.Opt{kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(50 * time.Millisecond), kgo.DefaultProduceTopic("t"),
		kgo.ProducerBatchCompression(kgo.NoCompression())}
	if !idempotent {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var rs []*kgo.Record
	for i, v := range values {
		rs = append(rs, &kgo.Record{Key: []byte{'k', byte('0' + i)}, Value: []byte(v), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("x")}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("t")
	mreq.Topics = append(mreq.Topics, mt)
	md, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrFetchRequest()
	req.MaxBytes = 64 << 20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = "t", md.Topics[0].TopicID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.PartitionMaxBytes = 64 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.Topics[0].Partitions[0]; p.ErrorCode != 0 || len(p.RecordBatches) == 0 {
		t.Fatalf("fetch: error %d, %d bytes", p.ErrorCode, len(p.RecordBatches))
	}
	return resp.Topics[0].Partitions[0].RecordBatches
}

// produce runs the chain over one partition of topic t holding set.
func produce(ch *interceptor.Chain, set []byte) (interceptor.ProduceOutcome, *kmsg.ProduceRequest) {
	req := kmsg.NewPtrProduceRequest()
	req.Version = 9
	req.Acks = -1
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "t"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = append([]byte(nil), set...)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return ch.InterceptProduce(context.Background(), req, nil), req
}

// decode reads a record set as a consumer does.
func decode(t *testing.T, set []byte) []*kgo.Record {
	t.Helper()
	p := kmsg.NewFetchResponseTopicPartition()
	p.RecordBatches = set
	p.HighWatermark = 1 << 40
	fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Topic: "t"}, &p, kgo.DefaultDecompressor(), nil)
	if fp.Err != nil {
		t.Fatal(fp.Err)
	}
	return fp.Records
}

func values(rs []*kgo.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, string(r.Value))
	}
	return out
}

func TestChainUpperProduceAndFetch(t *testing.T) {
	ch, err := build(t, "upper", nil, interceptor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set := batches(t, true, "hello", "world")
	out, req := produce(ch, set)
	if !out.Forward || len(out.Answered) > 0 || out.Rewritten != 1 {
		t.Fatalf("outcome %+v", out)
	}
	got := decode(t, req.Topics[0].Partitions[0].Records)
	if v := values(got); strings.Join(v, ",") != "HELLO,WORLD" || string(got[1].Key) != "k1" || string(got[0].Headers[0].Value) != "x" {
		t.Fatalf("produced %v", v)
	}
	// Fetch: the same module upper-cases what the broker returns.
	resp := kmsg.NewPtrFetchResponse()
	rt := kmsg.NewFetchResponseTopic()
	rt.Topic = "t"
	rp := kmsg.NewFetchResponseTopicPartition()
	rp.RecordBatches = set
	rp.HighWatermark = 2
	rt.Partitions = append(rt.Partitions, rp)
	resp.Topics = append(resp.Topics, rt)
	fo := ch.InterceptFetch(context.Background(), resp)
	if len(fo.Failed) > 0 {
		t.Fatal(fo.Failed[0].Err)
	}
	if v := values(decode(t, resp.Topics[0].Partitions[0].RecordBatches)); strings.Join(v, ",") != "HELLO,WORLD" {
		t.Fatalf("fetched %v", v)
	}
}

// cannedOut is a module output for the canned module.
func cannedOut(res ...abi.Result) map[string]string {
	return map[string]string{KeyConfigPrefix + "out": string(abi.EncodeOutput(nil, res))}
}

func TestChainActions(t *testing.T) {
	keep, skip := abi.Result{Action: abi.Keep}, abi.Result{Action: abi.Skip}
	repl := abi.Result{Action: abi.Replace, Key: nil, Value: []byte("new"), Headers: []abi.Header{{Key: "a", Value: []byte("b")}}}
	t.Run("replace and skip", func(t *testing.T) {
		ch, err := build(t, "canned", cannedOut(repl, skip, keep), interceptor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		out, req := produce(ch, batches(t, false, "a", "b", "c"))
		if !out.Forward {
			t.Fatalf("%+v", out.Answered)
		}
		got := decode(t, req.Topics[0].Partitions[0].Records)
		if v := values(got); strings.Join(v, ",") != "new,c" || got[0].Key != nil || len(got[0].Headers) != 1 || got[0].Headers[0].Key != "a" {
			t.Fatalf("got %v %+v", v, got[0])
		}
	})
	t.Run("skip in an idempotent batch", func(t *testing.T) {
		ch, _ := build(t, "canned", cannedOut(keep, skip), interceptor.Options{})
		out, _ := produce(ch, batches(t, true, "a", "b"))
		if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.InvalidRecord.Code || !strings.Contains(out.Answered[0].ErrorMessage, "idempotent") {
			t.Fatalf("%+v", out.Answered)
		}
	})
	t.Run("reject", func(t *testing.T) {
		ch, _ := build(t, "canned", cannedOut(keep, abi.Result{Action: abi.Reject, Reason: "no PII allowed"}), interceptor.Options{})
		out, _ := produce(ch, batches(t, true, "a", "b"))
		a := out.Answered
		if len(a) != 1 || a[0].ErrorCode != kerr.InvalidRecord.Code || len(a[0].RecordErrors) != 1 || a[0].RecordErrors[0].RelativeOffset != 1 ||
			!strings.Contains(*a[0].RecordErrors[0].ErrorMessage, "no PII allowed") {
			t.Fatalf("%+v", a)
		}
	})
	t.Run("wrong record count", func(t *testing.T) {
		m, _ := observe.NewMetrics(nil, observe.MetricsOptions{})
		ch, _ := build(t, "canned", cannedOut(keep), interceptor.Options{Metrics: m})
		out, _ := produce(ch, batches(t, true, "a", "b"))
		if len(out.Answered) != 1 || !strings.Contains(out.Answered[0].ErrorMessage, "malformed_output") {
			t.Fatalf("%+v", out.Answered)
		}
		if n := failures(m, "canned.wasm", "produce", KindMalformedOutput); n != 1 {
			t.Fatalf("counted %v", n)
		}
	})
}

// failures reads ferry_wasm_failures_total{module, direction, kind}.
func failures(m *observe.Metrics, module, direction, kind string) float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collectors()...)
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "ferry_wasm_failures_total" {
			continue
		}
	next:
		for _, mt := range mf.GetMetric() {
			want := map[string]string{"module": module, "direction": direction, "kind": kind}
			for _, l := range mt.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return mt.GetCounter().GetValue()
		}
	}
	return 0
}
