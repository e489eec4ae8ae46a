package observe_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/payloadstore"
)

func newMetrics(t *testing.T, reg prometheus.Registerer, max int) *observe.Metrics {
	t.Helper()
	m, err := observe.NewMetrics(reg, observe.MetricsOptions{MaxTopics: max})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if m.Histogram != nil {
				return float64(m.Histogram.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// TestMetricsTopicBound: with metrics.topics.max=2 the first two topics
// get their own series and the others share topic="other"; at the limit
// exactly, no "other" series is made for a known topic.
func TestMetricsTopicBound(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(t, reg, 2)
	m.Offloaded("a", 10)
	m.Offloaded("b", 20)
	m.Offloaded("a", 1) // at the limit: a known topic keeps its series
	if got := counter(t, reg, "ferry_offloaded_bytes_total", "topic", "other"); got != 0 {
		t.Fatalf("other before the third topic: %v, want 0", got)
	}
	m.Offloaded("c", 30)
	m.Resolved("d", 40)
	m.Rejected("e", observe.DirectionProduce, "INVALID_RECORD")
	for _, c := range []struct {
		name, topic string
		want        float64
	}{
		{"ferry_offloaded_bytes_total", "a", 11},
		{"ferry_offloaded_records_total", "a", 2},
		{"ferry_offloaded_bytes_total", "b", 20},
		{"ferry_offloaded_bytes_total", "other", 30},
		{"ferry_resolved_bytes_total", "other", 40},
		{"ferry_interceptor_rejections_total", "other", 1},
		{"ferry_offloaded_bytes_total", "c", -1},
	} {
		if got := counter(t, reg, c.name, "topic", c.topic); got != c.want {
			t.Errorf("%s{topic=%q} = %v, want %v", c.name, c.topic, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(reg, "ferry_offloaded_bytes_total"); n != 3 {
		t.Errorf("%d series of ferry_offloaded_bytes_total, want 3 (a, b, other)", n)
	}
}

// TestStoreSeriesMadeAtOnce: a topic's first count makes, at zero, the
// store series of the operations Ferry's observed stores perform (the
// proxy's large-message), so rate() sees their first count; ferry gc's own
// operations (move, put, get), which only a program running lifecycle.GC on
// an observed store performs, are made at their first count instead of as
// zero-valued series for every topic.
func TestStoreSeriesMadeAtOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(t, reg, 0)
	m.Offloaded("orders", 1)
	ops := func(name, topic string) map[string]int {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, s := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range s.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if l["topic"] == topic {
					got[l["operation"]]++
				}
			}
		}
		return got
	}
	eager := []string{observe.OpPublish, observe.OpDownload, observe.OpDelete, observe.OpStat, observe.OpCopy, observe.OpTouch, observe.OpRemove, observe.OpList}
	for _, topic := range []string{"orders", observe.OtherTopic} {
		counts, hists := ops("ferry_store_operations_total", topic), ops("ferry_store_operation_duration_seconds", topic)
		if len(counts) != len(eager) || len(hists) != len(eager) {
			t.Errorf("topic %s: operations %v and histograms %v, want %v", topic, counts, hists, eager)
		}
		for _, op := range eager {
			if counts[op] != 2 || hists[op] != 1 {
				t.Errorf("topic %s operation %s: %d counters (want ok and error), %d histograms (want 1)", topic, op, counts[op], hists[op])
			}
		}
	}

	ctx := context.Background()
	raw, err := payloadstore.Open(ctx, "mem://series-"+t.Name(), payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := observe.Store(raw, m, nil)
	defer s.Close()
	o, err := payloadstore.Objects(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Put(ctx, "orders/.ferry-gc/x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := o.Move(ctx, "orders/.ferry-gc/x", "orders/.ferry-gc/y"); err != nil {
		t.Fatal(err)
	}
	counts, hists := ops("ferry_store_operations_total", "orders"), ops("ferry_store_operation_duration_seconds", "orders")
	for _, op := range []string{observe.OpPut, observe.OpMove} {
		if counts[op] != 2 || hists[op] != 1 {
			t.Errorf("after a %s: %d counters (want ok and error), %d histograms (want 1)", op, counts[op], hists[op])
		}
	}
	if counts[observe.OpGet] != 0 || hists[observe.OpGet] != 0 {
		t.Errorf("get, never performed: %d counters and %d histograms, want none", counts[observe.OpGet], hists[observe.OpGet])
	}
	for _, c := range []struct {
		op, result string
		want       float64
	}{{observe.OpMove, "ok", 1}, {observe.OpMove, "error", 0}, {observe.OpPut, "ok", 1}} {
		if got := counter(t, reg, "ferry_store_operations_total", "topic", "orders", "operation", c.op, "result", c.result); got != c.want {
			t.Errorf("%s %s = %v, want %v", c.op, c.result, got, c.want)
		}
	}
}

// TestMetricsErrors: a negative bound is refused; a second set on the
// same registry is refused (nothing registers globally).
func TestMetricsErrors(t *testing.T) {
	if _, err := observe.NewMetrics(nil, observe.MetricsOptions{MaxTopics: -1}); !errors.Is(err, observe.ErrMaxTopics) {
		t.Fatalf("MaxTopics -1: %v", err)
	}
	reg := prometheus.NewRegistry()
	newMetrics(t, reg, 0)
	var are prometheus.AlreadyRegisteredError
	if _, err := observe.NewMetrics(reg, observe.MetricsOptions{}); !errors.As(err, &are) {
		t.Fatalf("registered twice: %v", err)
	}
	var nilM *observe.Metrics // a nil *Metrics does nothing
	nilM.Offloaded("t", 1)
	nilM.Rejected("t", "produce", "X")
	if nilM.InterceptorObserver("x", "produce") != nil {
		t.Fatal("nil Metrics gave an observer")
	}
}

// TestStoreFile: the observed file store counts each operation by topic,
// operation and result, and the payloads and bytes published and read;
// it keeps the file store's one-pass publishing (payloadstore.OnePass) and
// spans its operations under a parent span only.
func TestStoreFile(t *testing.T) {
	ctx := context.Background()
	raw, err := payloadstore.Open(ctx, "file://"+t.TempDir(), payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := newMetrics(t, reg, 0)
	exp := tracetest.NewInMemoryExporter()
	tr := observe.NewTracer(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), "library")
	s := observe.Store(payloadstore.Wrap(raw, payloadstore.DefaultPolicy), m, tr)
	defer s.Close()
	if payloadstore.Unwrap(s) != raw {
		t.Fatal("Unwrap does not see through the observed store")
	}
	sp := payloadstore.StreamPayload(bytes.NewReader(make([]byte, 1000)), 1000)
	if !payloadstore.OnePass(s, sp) {
		t.Fatal("the observed file store lost one-pass publishing")
	}
	resp, err := s.Publish(ctx, "orders", sp)
	if err != nil {
		t.Fatal(err)
	}
	pctx, parent := tr.StartSend(ctx, "orders", 0, nil)
	if _, err := payloadstore.PublishBytes(pctx, s, "orders", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	parent.End()
	b, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
	if err != nil || len(b) != 1000 {
		t.Fatalf("download: %d bytes, %v", len(b), err)
	}
	if err := s.Delete(ctx, resp.FullPayloadPath); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Download(ctx, resp.FullPayloadPath); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
		t.Fatalf("deleted object: %v", err)
	}
	ops, err := payloadstore.Objects(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := ops.Put(ctx, "orders/.ferry-gc/x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Get(ctx, "orders/.ferry-gc/x", 10); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"ferry_offloaded_records_total", []string{"topic", "orders"}, 2},
		{"ferry_offloaded_bytes_total", []string{"topic", "orders"}, 1005},
		{"ferry_resolved_records_total", []string{"topic", "orders"}, 1},
		{"ferry_resolved_bytes_total", []string{"topic", "orders"}, 1000},
		{"ferry_store_operations_total", []string{"topic", "orders", "operation", "publish", "result", "ok"}, 2},
		{"ferry_store_operations_total", []string{"topic", "orders", "operation", "download", "result", "ok"}, 1},
		{"ferry_store_operations_total", []string{"topic", "orders", "operation", "download", "result", "error"}, 1},
		{"ferry_store_operations_total", []string{"topic", "orders", "operation", "delete", "result", "ok"}, 1},
		{"ferry_store_operations_total", []string{"topic", "orders", "operation", "put", "result", "ok"}, 1},
		{"ferry_store_operations_total", []string{"topic", "orders", "operation", "get", "result", "ok"}, 1},
		{"ferry_store_operation_duration_seconds", []string{"topic", "orders", "operation", "download"}, 2},
	} {
		if got := counter(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	spans := exp.GetSpans().Snapshots()
	if len(spans) != 2 || spans[0].Name() != "ferry.store publish" || spans[0].Parent().SpanID() != parent.SpanContext().SpanID() {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name())
		}
		t.Fatalf("spans %v: want the one publish under a parent, then the parent", names)
	}
}

// TestHeaderContext: Inject writes traceparent once (replacing every old
// one), Extract reads it back; without a span nothing is written.
func TestHeaderContext(t *testing.T) {
	tr := observe.NewTracer(sdktrace.NewTracerProvider(), "library")
	var hs []kgo.RecordHeader
	tr.Inject(context.Background(), &hs)
	if len(hs) != 0 {
		t.Fatalf("headers without a span: %v", hs)
	}
	hs = []kgo.RecordHeader{{Key: "a", Value: []byte("b")}, {Key: observe.HeaderTraceParent, Value: []byte("00-stale")}}
	ctx, span := tr.StartSend(context.Background(), "t", -1, nil)
	tr.Inject(ctx, &hs)
	span.End()
	if len(hs) != 2 || hs[1].Key != observe.HeaderTraceParent || !strings.Contains(string(hs[1].Value), span.SpanContext().SpanID().String()) {
		t.Fatalf("headers %q", hs)
	}
	if sc := tr.Extract(hs); sc.SpanID() != span.SpanContext().SpanID() || !sc.IsRemote() {
		t.Fatalf("extracted %v", sc)
	}
	// Three traceparent headers (a client's, repeated): every one is
	// replaced, so no reader (Java's lastHeader takes the last) sees a
	// stale parent.
	hs = []kgo.RecordHeader{{Key: observe.HeaderTraceParent, Value: []byte("00-first")}, {Key: "a", Value: []byte("b")},
		{Key: observe.HeaderTraceParent, Value: []byte("00-second")}, {Key: observe.HeaderTraceParent, Value: []byte("00-third")}}
	tr.Inject(ctx, &hs)
	n := 0
	for _, h := range hs {
		if h.Key == observe.HeaderTraceParent {
			n++
			if !strings.Contains(string(h.Value), span.SpanContext().SpanID().String()) {
				t.Fatalf("a traceparent header kept %q", h.Value)
			}
		}
	}
	if n != 3 || len(hs) != 4 {
		t.Fatalf("headers %q: want the 3 traceparent headers replaced in place", hs)
	}
	var off *observe.Tracer
	if off.Enabled() || off.Extract(hs).IsValid() {
		t.Fatal("a nil Tracer is on")
	}
}
