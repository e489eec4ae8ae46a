package integration

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/proxy"
)

// oneRecord is the records section of one uncompressed record with a value
// of n bytes.
func oneRecord(n int) []byte {
	var body []byte
	body = append(body, 0)                     // attributes
	body = binary.AppendVarint(body, 0)        // timestamp delta
	body = binary.AppendVarint(body, 0)        // offset delta
	body = binary.AppendVarint(body, -1)       // no key
	body = binary.AppendVarint(body, int64(n)) // value length
	body = append(body, make([]byte, n)...)    // value
	body = binary.AppendUvarint(body, 0)       // no headers
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// TestObserveProxyTopicNotUTF8: a client's Produce request names a topic
// whose bytes are not UTF-8 (the broker refuses it, but the proxy's
// interceptors see it first). The large-message interceptor refuses it and
// counts the rejection under the topic label: that label must not panic
// the proxy (Prometheus panics on a label value that is not UTF-8), and
// /metrics must still parse.
func TestObserveProxyTopicNotUTF8(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	good := newTopic(t, nil)
	srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), AdminListen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{largeMessageSpec(".*", storeURL)}})
	cl := viaClient(t, srv.Addr(), kgo.RequestRetries(0))
	bad := "bad\xff\xfe-topic"
	codes := rawProduce(t, cl, map[string][]byte{bad: rawBatch(oneRecord(2<<20), 0, 1)}, nil)
	if codes[bad] == 0 {
		t.Fatalf("a produce to a topic that is not UTF-8 succeeded")
	}
	t.Logf("error code of the topic that is not UTF-8: %d", codes[bad])
	// The proxy still serves, and its /metrics parse.
	if err := viaClient(t, srv.Addr()).ProduceSync(ctxT(t, time.Minute), &kgo.Record{Topic: good, Value: []byte("after")}).FirstErr(); err != nil {
		t.Fatalf("produce after the bad topic: %v", err)
	}
	fams := scrape(t, srv.AdminAddr())
	if n := metricValue(fams, "ferry_interceptor_rejections_total", map[string]string{"topic": "bad\uFFFD-topic", "direction": "produce"}); n != 1 {
		t.Errorf("rejections of the bad topic (label with U+FFFD): %v, want 1", n)
	}
}
