package integration

// Observability against the real broker and the real S3 server (a file
// store without one): the per-topic metrics the proxy serves on /metrics
// and the library's, checked against what was produced and consumed, and
// the spans of produce → object publish → fetch → download, linked through
// the traceparent header (an in-memory span exporter).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/proxy"
)

// scrape reads the proxy's /metrics.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// gathered reads a registry like scrape reads /metrics.
func gathered(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// metricValue is the value of the counter (or the count of the histogram)
// name whose labels include want; -1 when there is none.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func spansNamed(spans tracetest.SpanStubs, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans.Snapshots() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// TestObserveProxy: three 2 MiB records through the proxy's large-message
// interceptor (the broker's 1 MiB limit), two small ones, one refused
// (a malformed reference); /metrics counts 3 offloaded and 3 resolved
// payloads of 2 MiB each, 3 publishes and 3 downloads of the topic, one
// INVALID_RECORD rejection; the spans form send (child of the client's
// span) → ferry.store publish, and receive (linked to send) → ferry.store
// download.
func TestObserveProxy(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	topic := newTopic(t, nil)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), AdminListen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{largeMessageSpec(topic, storeURL)}, TracerProvider: tp})
	via := srv.Addr()

	// The client is instrumented itself: its span's context rides in the
	// traceparent header of the first record.
	clientTP := sdktrace.NewTracerProvider()
	cctx, clientSpan := clientTP.Tracer("client").Start(context.Background(), "client send")
	clientSpan.End()
	var hs []kgo.RecordHeader
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(cctx, carrier)
	hs = append(hs, kgo.RecordHeader{Key: "traceparent", Value: []byte(carrier["traceparent"])})

	const size, big = 2 << 20, 3
	cl := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(16<<20), kgo.MaxBufferedBytes(64<<20))
	want := map[string][]byte{}
	var recs []*kgo.Record
	for i := range big {
		k := fmt.Sprintf("big-%d", i)
		want[k] = printable(uint64(60+i), size)
		r := &kgo.Record{Key: []byte(k), Value: want[k]}
		if i == 0 {
			r.Headers = hs
		}
		recs = append(recs, r)
	}
	for i := range 2 {
		k := fmt.Sprintf("small-%d", i)
		want[k] = printable(uint64(70+i), 100)
		recs = append(recs, &kgo.Record{Key: []byte(k), Value: want[k]})
	}
	for _, r := range recs { // one at a time: each its own batch
		if err := cl.ProduceSync(ctxT(t, time.Minute), r).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", r.Key, err)
		}
	}
	// A record whose reference names another topic's object: refused
	// (large.message.reference.copy.topics is empty in the proxy).
	raw := consumeRaw(t, topic, 1)[0]
	ref, err := largemessage.DecodeReference(raw.Value)
	if err != nil {
		t.Fatal(err)
	}
	ref.FullPayloadPath = strings.Replace(ref.FullPayloadPath, "/"+topic+"/", "/other-topic/", 1)
	bad := &kgo.Record{Key: []byte("bad"), Headers: raw.Headers}
	if bad.Value, err = ref.AppendTo(nil); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctxT(t, time.Minute), bad).FirstErr(); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("a reference into another topic through the proxy: %v, want INVALID_RECORD", err)
	}

	// Consume through the proxy: the payloads come back.
	cons := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20))
	got := map[string]*kgo.Record{}
	ctx := ctxT(t, 2*time.Minute)
	for len(got) < len(want) {
		fs := cons.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("fetch: %v", err)
		}
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Key)] = r })
	}
	for k, v := range want {
		if !bytes.Equal(got[k].Value, v) {
			t.Fatalf("record %s: %d bytes back, want %d", k, len(got[k].Value), len(v))
		}
	}

	fams := scrape(t, srv.AdminAddr())
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ferry_offloaded_records_total", map[string]string{"topic": topic}, big},
		{"ferry_offloaded_bytes_total", map[string]string{"topic": topic}, big * size},
		{"ferry_resolved_records_total", map[string]string{"topic": topic}, big},
		{"ferry_resolved_bytes_total", map[string]string{"topic": topic}, big * size},
		{"ferry_store_operations_total", map[string]string{"topic": topic, "operation": "publish", "result": "ok"}, big},
		{"ferry_store_operations_total", map[string]string{"topic": topic, "operation": "download", "result": "ok"}, big},
		{"ferry_store_operations_total", map[string]string{"topic": topic, "operation": "publish", "result": "error"}, 0},
		{"ferry_store_operation_duration_seconds", map[string]string{"topic": topic, "operation": "publish"}, big},
		{"ferry_interceptor_rejections_total", map[string]string{"topic": topic, "direction": "produce", "reason": "INVALID_RECORD"}, 1},
	} {
		if got := metricValue(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Every produced record large-message acts on went through it (the
	// offloaded ones and the refused reference); every fetched reference at
	// least once. The small records' batches are skimmed (docs/INTERCEPTORS.md,
	// "Skimmed requests and responses"): no call is made or timed for them.
	if n := metricValue(fams, "ferry_interceptor_duration_seconds", map[string]string{"interceptor": "large-message", "direction": "produce"}); n < big+1 {
		t.Errorf("large-message produce calls timed: %v, want >= %d", n, big+1)
	}
	if n := metricValue(fams, "ferry_interceptor_duration_seconds", map[string]string{"interceptor": "large-message", "direction": "fetch"}); n < big {
		t.Errorf("large-message fetch calls timed: %v, want >= %d", n, big)
	}

	spans := exp.GetSpans()
	sends := spansNamed(spans, "send "+topic)
	publishes := spansNamed(spans, "ferry.store publish")
	receives := spansNamed(spans, "receive "+topic)
	downloads := spansNamed(spans, "ferry.store download")
	if len(sends) != big || len(publishes) != big || len(receives) < big || len(downloads) < big {
		t.Fatalf("spans: %d send, %d publish, %d receive, %d download; want %d each (receive, download: at least)",
			len(sends), len(publishes), len(receives), len(downloads), big)
	}
	sendByID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	childOfClient := 0
	var underClient sdktrace.ReadOnlySpan
	for _, s := range sends {
		sendByID[s.SpanContext().SpanID()] = s
		if s.SpanKind() != trace.SpanKindProducer {
			t.Errorf("send span kind %v", s.SpanKind())
		}
		for k, v := range map[attribute.Key]string{"messaging.system": "kafka", "messaging.destination.name": topic,
			"messaging.operation.type": "send", "messaging.destination.partition.id": "0", "ferry.component": "proxy"} {
			if got, _ := spanAttr(s, k); got.Emit() != v {
				t.Errorf("send span %s = %q, want %q", k, got.Emit(), v)
			}
		}
		if s.Parent().SpanID() == clientSpan.SpanContext().SpanID() {
			childOfClient++
			underClient = s
			if s.SpanContext().TraceID() != clientSpan.SpanContext().TraceID() {
				t.Errorf("the send span under the client's is in trace %s, not the client's %s", s.SpanContext().TraceID(), clientSpan.SpanContext().TraceID())
			}
		}
	}
	if childOfClient != 1 {
		t.Errorf("%d send spans have the client's span as parent, want 1", childOfClient)
	}
	for _, p := range publishes {
		if _, ok := sendByID[p.Parent().SpanID()]; !ok {
			t.Errorf("publish span %s: parent %s is no send span", p.SpanContext().SpanID(), p.Parent().SpanID())
		}
		if v, _ := spanAttr(p, observe.AttrPayloadSize); v.AsInt64() != size {
			t.Errorf("publish span ferry.payload.size %v, want %d", v.AsInt64(), size)
		}
	}
	// Each big record as consumed carries the traceparent of its send
	// span; its receive span links to it and has its offset.
	receiveByID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	linked := 0
	for _, r := range receives {
		receiveByID[r.SpanContext().SpanID()] = r
		if len(r.Links()) != 1 {
			t.Errorf("receive span with %d links, want 1", len(r.Links()))
			continue
		}
		s, ok := sendByID[r.Links()[0].SpanContext.SpanID()]
		if !ok {
			t.Errorf("receive span links to %s, no send span", r.Links()[0].SpanContext.SpanID())
			continue
		}
		linked++
		off, _ := spanAttr(r, "messaging.kafka.offset")
		var rec *kgo.Record
		for _, g := range got {
			if g.Offset == off.AsInt64() {
				rec = g
			}
		}
		if rec == nil {
			t.Errorf("receive span offset %d names no consumed record", off.AsInt64())
			continue
		}
		var tpHeader string
		for _, h := range rec.Headers {
			if h.Key == "traceparent" {
				tpHeader = string(h.Value)
			}
		}
		if !strings.Contains(tpHeader, s.SpanContext().SpanID().String()) || !strings.Contains(tpHeader, s.SpanContext().TraceID().String()) {
			t.Errorf("record %s at offset %d: traceparent %q does not name its send span %s", rec.Key, rec.Offset, tpHeader, s.SpanContext().SpanID())
		}
	}
	if linked < big {
		t.Errorf("%d receive spans linked to send spans, want %d", linked, big)
	}
	for _, d := range downloads {
		if _, ok := receiveByID[d.Parent().SpanID()]; !ok {
			t.Errorf("download span: parent %s is no receive span", d.Parent().SpanID())
		}
	}
	// A third-party consumer through the proxy sees the header too: the
	// first record's traceparent names the client's trace and the
	// proxy's send span.
	t.Run("kcat", func(t *testing.T) {
		if underClient == nil {
			t.Fatal("no send span under the client's (above)")
		}
		out := runClient(t, nil, kcatPath(t), "-C", "-b", via, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k|%h\n")
		want := fmt.Sprintf("big-0|traceparent=00-%s-%s-01", clientSpan.SpanContext().TraceID(), underClient.SpanContext().SpanID())
		if !strings.Contains(string(out), want) {
			t.Fatalf("kcat output %q lacks %q", out, want)
		}
	})
	t.Logf("metrics and %d spans checked (%d send, %d publish, %d receive, %d download)", len(spans), len(sends), len(publishes), len(receives), len(downloads))
}

// TestObserveLibrary: the library's Producer and Consumer over a file store
// observed on a registry of the test's own: 2 records of 3 MiB offloaded
// and resolved; the consumer's process spans link to the producer's send
// spans, which carry the acknowledged partition and offset.
func TestObserveLibrary(t *testing.T) {
	topic := newTopic(t, nil)
	exp := tracetest.NewInMemoryExporter()
	tr := observe.NewTracer(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), "library")
	reg := prometheus.NewRegistry()
	m, err := observe.NewMetrics(reg, observe.MetricsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = fileStoreURL(t)
	raw, err := cfg.OpenStore(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	store := observe.Store(raw, m, tr)
	pcl := client(t, kgo.DefaultProduceTopic(topic))
	prod, err := largemessage.NewProducer(pcl, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	prod.WithTracer(tr)
	const size, n = 3 << 20, 2
	for i := range n {
		if err := prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Value: printable(uint64(80+i), size)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ccl := client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	cons := largemessage.NewConsumer(ccl, cfg.NewDeserializer(store)).WithTracer(tr)
	var recs []largemessage.Record
	ctx := ctxT(t, time.Minute)
	for len(recs) < n {
		rs, err := cons.PollRecords(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rs...)
	}
	for _, r := range recs {
		if r.Err != nil || len(r.Value) != size {
			t.Fatalf("offset %d: %d bytes, %v", r.Offset, len(r.Value), r.Err)
		}
	}
	fams := gathered(t, reg)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ferry_offloaded_records_total", map[string]string{"topic": topic}, n},
		{"ferry_offloaded_bytes_total", map[string]string{"topic": topic}, n * size},
		{"ferry_resolved_records_total", map[string]string{"topic": topic}, n},
		{"ferry_resolved_bytes_total", map[string]string{"topic": topic}, n * size},
		{"ferry_store_operations_total", map[string]string{"topic": topic, "operation": "publish", "result": "ok"}, n},
		{"ferry_store_operations_total", map[string]string{"topic": topic, "operation": "download", "result": "ok"}, n},
	} {
		if got := metricValue(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	spans := exp.GetSpans()
	sends := spansNamed(spans, "send "+topic)
	procs := spansNamed(spans, "process "+topic)
	if len(sends) != n || len(procs) != n || len(spansNamed(spans, "ferry.store publish")) != n || len(spansNamed(spans, "ferry.store download")) != n {
		t.Fatalf("spans: %d send, %d process (want %d each); all: %d", len(sends), len(procs), n, len(spans))
	}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range sends {
		byID[s.SpanContext().SpanID()] = s
	}
	for _, p := range procs {
		if len(p.Links()) != 1 {
			t.Fatalf("process span: %d links", len(p.Links()))
		}
		s := byID[p.Links()[0].SpanContext.SpanID()]
		if s == nil {
			t.Fatalf("process span links to no send span")
		}
		so, ok := spanAttr(s, "messaging.kafka.offset")
		po, _ := spanAttr(p, "messaging.kafka.offset")
		if !ok || so.AsInt64() != po.AsInt64() {
			t.Errorf("send span offset %v, process span offset %v: want the same", so.Emit(), po.Emit())
		}
	}
}
