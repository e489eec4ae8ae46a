package otlp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferrykit/ferry/observe"
	"github.com/ferrykit/ferry/observe/otlp"
)

// TestOTLPExportTopicNotUTF8: a topic name is whatever bytes a client's
// produce request holds. A span naming a topic that is not UTF-8 must not
// cost the batch it is exported in (protobuf refuses strings that are not
// UTF-8): the other spans of the batch arrive, and so does this one.
func TestOTLPExportTopicNotUTF8(t *testing.T) {
	var (
		mu    sync.Mutex
		names []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names = append(names, s.Name)
				}
			}
		}
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
	_, span := tr.StartSend(ctx, "orders", 0, nil)
	observe.EndSend(span, 0, 1, nil)
	_, span = tr.StartSend(ctx, "bad\xff", 0, nil)
	observe.EndSend(span, 0, 2, nil)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = shutdown(sctx)
	mu.Lock()
	defer mu.Unlock()
	if len(names) != 2 {
		t.Fatalf("the receiver got spans %q, want \"send orders\" and the bad topic's", names)
	}
}
