package otlp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/observe/otlp"
)

// TestOTLPExport: SetupTracing's exporter delivers a span to an OTLP/HTTP
// receiver (an httptest server decoding the protobuf request), with its
// messaging attributes and the service name.
func TestOTLPExport(t *testing.T) {
	var (
		mu  sync.Mutex
		got []*collectortrace.ExportTraceServiceRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+r.URL.Path+" "+r.Header.Get("Content-Type"), http.StatusBadRequest)
			return
		}
		if err := proto.Unmarshal(body, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	}))
	defer srv.Close()
	ctx := context.Background()
	tp, shutdown, err := otlp.SetupTracing(ctx, observe.TracingConfig{Enabled: true, Endpoint: srv.URL + "/v1/traces", ServiceName: "ferry-test"})
	if err != nil {
		t.Fatal(err)
	}
	tr := observe.NewTracer(tp, "proxy")
	_, span := tr.StartSend(ctx, "orders", 3, nil)
	observe.EndSend(span, 3, 42, nil)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var found bool
	for _, req := range got {
		for _, rs := range req.ResourceSpans {
			var service string
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					attrs := map[string]string{}
					var offset int64 = -1
					for _, a := range s.Attributes {
						attrs[a.Key] = a.GetValue().GetStringValue()
						if a.Key == "messaging.kafka.offset" {
							offset = a.GetValue().GetIntValue()
						}
					}
					if s.Name == "send orders" && attrs["messaging.system"] == "kafka" && attrs["messaging.destination.partition.id"] == "3" && offset == 42 && service == "ferry-test" {
						found = true
					}
				}
			}
		}
	}
	if !found {
		t.Fatalf("the receiver got %d requests without the span \"send orders\" of service ferry-test", len(got))
	}
	// Off: no provider, nothing exported.
	if tp, _, err := otlp.SetupTracing(ctx, observe.TracingConfig{}); tp != nil || err != nil {
		t.Fatalf("tracing off: %v, %v", tp, err)
	}
	// A bad endpoint is a clear error.
	if _, _, err := otlp.SetupTracing(ctx, observe.TracingConfig{Enabled: true, Endpoint: "::not a url"}); err == nil || !strings.Contains(err.Error(), observe.KeyTracingEndpoint) {
		t.Fatalf("bad endpoint: %v", err)
	}
}
