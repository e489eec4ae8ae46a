package observe_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferrykit/ferry/observe"
)

// FuzzTraceHeaders: whatever traceparent and tracestate a client's record
// carries, the proxy's spans start and end without panicking, and the
// context the proxy injects back is well formed.
func FuzzTraceHeaders(f *testing.F) {
	f.Add("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "congo=t61rcWkgMzE")
	f.Add("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "")
	f.Add("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", "a=b,c=d,,")
	exp := tracetest.NewInMemoryExporter()
	tr := observe.NewTracer(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), "proxy")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		hs := []kgo.RecordHeader{{Key: observe.HeaderTraceParent, Value: []byte(tp)}, {Key: observe.HeaderTraceState, Value: []byte(ts)}}
		ctx, span := tr.StartSend(context.Background(), "t", 0, hs)
		tr.Inject(ctx, &hs)
		observe.EndSend(span, 0, 1, nil)
		_, span = tr.StartReceive(context.Background(), "receive", "t", 0, 1, hs)
		observe.End(span, nil)
		if sc := tr.Extract(hs); !sc.IsValid() {
			t.Fatalf("the injected traceparent %q does not parse", hs[0].Value)
		}
		exp.Reset()
	})
}
