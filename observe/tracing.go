package observe

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of Ferry's spans.
const ScopeName = "github.com/ferrykit/ferry"

// HeaderTraceParent and HeaderTraceState are the record headers that carry
// the W3C trace context (https://www.w3.org/TR/trace-context/), as the
// OpenTelemetry Kafka instrumentations of Java and Go write them.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Span attributes of Ferry's own (the messaging.* ones follow the
// OpenTelemetry messaging and Kafka semantic conventions v1.43.0).
const (
	AttrStoreOperation = attribute.Key("ferry.store.operation") // publish, download, ...
	AttrStoreClass     = attribute.Key("ferry.store.class")     // payloadStoreClass
	AttrPayloadPath    = attribute.Key("ferry.payload.path")    // the object's full path
	AttrPayloadSize    = attribute.Key("ferry.payload.size")    // bytes
	AttrComponent      = attribute.Key("ferry.component")       // library, proxy
)

// Tracer makes Ferry's spans from a trace.TracerProvider and carries their
// context in record headers. Methods on a nil *Tracer do nothing (and
// return ctx and a no-op span).
type Tracer struct {
	t         trace.Tracer
	prop      propagation.TraceContext
	component attribute.KeyValue
}

// NewTracer returns a Tracer over tp (nil tp: a nil Tracer, tracing off);
// component ("library", "proxy") is set on every span as ferry.component.
func NewTracer(tp trace.TracerProvider, component string) *Tracer {
	if tp == nil {
		return nil
	}
	return &Tracer{t: tp.Tracer(ScopeName), component: AttrComponent.String(component)}
}

// Enabled reports whether t makes spans.
func (t *Tracer) Enabled() bool { return t != nil }

// headerCarrier is a propagation.TextMapCarrier over record headers.
type headerCarrier struct{ hs *[]kgo.RecordHeader }

func (c headerCarrier) Get(key string) string {
	for _, h := range *c.hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set replaces the value of every header named key (Kafka headers may
// repeat, and a reader may take any of them: Java's lastHeader takes the
// last), else adds one.
func (c headerCarrier) Set(key, value string) {
	found := false
	for i, h := range *c.hs {
		if h.Key == key {
			(*c.hs)[i].Value = []byte(value)
			found = true
		}
	}
	if !found {
		*c.hs = append(*c.hs, kgo.RecordHeader{Key: key, Value: []byte(value)})
	}
}

func (c headerCarrier) Keys() []string {
	ks := make([]string, len(*c.hs))
	for i, h := range *c.hs {
		ks[i] = h.Key
	}
	return ks
}

// Inject writes ctx's span context into headers as traceparent (and
// tracestate when set), replacing every header of those names present. Nothing is
// written when ctx holds no valid span context.
func (t *Tracer) Inject(ctx context.Context, headers *[]kgo.RecordHeader) {
	if t == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	t.prop.Inject(ctx, headerCarrier{headers})
}

// Extract returns the span context carried in headers (invalid when none).
func (t *Tracer) Extract(headers []kgo.RecordHeader) trace.SpanContext {
	if t == nil || !hasHeader(headers, HeaderTraceParent) {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), headerCarrier{&headers}))
}

func hasHeader(hs []kgo.RecordHeader, key string) bool {
	for _, h := range hs {
		if h.Key == key {
			return true
		}
	}
	return false
}

func messagingAttrs(topic string, partition int32) []attribute.KeyValue {
	a := []attribute.KeyValue{semconv.MessagingSystemKafka, semconv.MessagingDestinationName(labelValue(topic))}
	if partition >= 0 {
		a = append(a, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(partition))))
	}
	return a
}

// StartSend starts the span of producing a record to topic (partition -1
// when not chosen yet): "send <topic>", kind producer,
// messaging.operation.type send. The caller ends it with EndSend. A
// parent in ctx, else one carried in headers (a client instrumented
// itself), becomes the span's parent.
func (t *Tracer) StartSend(ctx context.Context, topic string, partition int32, headers []kgo.RecordHeader) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noSpan()
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		if sc := t.Extract(headers); sc.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
	}
	attrs := append(messagingAttrs(topic, partition), semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"), t.component)
	return t.t.Start(ctx, "send "+labelValue(topic), trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
}

// EndSend ends a StartSend span with the record's partition and offset
// once the broker acknowledged it (offset -1: not known, as in the
// proxy), or with err.
func EndSend(span trace.Span, partition int32, offset int64, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		recordError(span, err)
	} else {
		if partition >= 0 {
			span.SetAttributes(semconv.MessagingDestinationPartitionID(strconv.Itoa(int(partition))))
		}
		if offset >= 0 {
			span.SetAttributes(semconv.MessagingKafkaOffset(int(offset)))
		}
	}
	span.End()
}

// StartReceive starts the span of handing a fetched record of topic to its
// consumer: "<op> <topic>" with op "receive" (the proxy's fetch) or
// "process" (the library consumer's Resolve), kind consumer. The producer's
// span context carried in headers becomes a link (OpenTelemetry's
// messaging conventions), and the parent is ctx's span, if any. End it
// with End.
func (t *Tracer) StartReceive(ctx context.Context, op, topic string, partition int32, offset int64, headers []kgo.RecordHeader) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noSpan()
	}
	opType := semconv.MessagingOperationTypeReceive
	if op == "process" {
		opType = semconv.MessagingOperationTypeProcess
	}
	attrs := append(messagingAttrs(topic, partition), opType, semconv.MessagingOperationName(op), t.component)
	if offset >= 0 {
		attrs = append(attrs, semconv.MessagingKafkaOffset(int(offset)))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if sc := t.Extract(headers); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return t.t.Start(ctx, op+" "+labelValue(topic), opts...)
}

// End ends span, with err as its status when not nil.
func End(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		recordError(span, err)
	}
	span.End()
}

// startStore starts a store operation's span, "ferry.store <op>", kind
// client, as a child of ctx's span. Without a parent no span is made: a
// store operation alone (gc's listing) is not traced.
func (t *Tracer) startStore(ctx context.Context, op, topic, class string, size int64) (context.Context, trace.Span) {
	if t == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, noSpan()
	}
	attrs := []attribute.KeyValue{AttrStoreOperation.String(op), AttrStoreClass.String(class), t.component}
	if topic != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(labelValue(topic)))
	}
	if size >= 0 {
		attrs = append(attrs, AttrPayloadSize.Int64(size))
	}
	return t.t.Start(ctx, fmt.Sprintf("ferry.store %s", op), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// recordError sets err as span's error status and exception event. OTLP
// carries strings as protobuf strings, which must be UTF-8: one that is
// not (a client's topic name quoted in an error) would lose the whole
// batch of spans it is exported with, so such a message reads with U+FFFD.
func recordError(span trace.Span, err error) {
	msg := err.Error()
	if !utf8.ValidString(msg) {
		msg = labelValue(msg)
		err = errors.New(msg)
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, msg)
}

// noSpan is a span that records nothing.
func noSpan() trace.Span { return trace.SpanFromContext(context.Background()) }
