package integration

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/proxy"
)

// TestReloadStormNoLeak: reloads of a proxy whose large-message
// interceptor writes to the real S3 server, each followed by an offloaded
// record (so each generation's store has connected): the goroutines the
// process holds do not grow with the number of reloads (each old chain's
// store is closed, with its HTTP connections).
func TestReloadStormNoLeak(t *testing.T) {
	storeURL := interceptorStoreURL(t)
	topic := newTopic(t, nil)
	cfg := proxy.Config{Upstream: proxy.SplitList(brokers(t)), AdminListen: "127.0.0.1:0",
		Interceptors: []interceptor.Spec{largeMessageSpec(topic, storeURL, "large.message.threshold.bytes=1000")}}
	srv := startProxyServer(t, cfg)
	cl := viaClient(t, srv.Addr(), kgo.DefaultProduceTopic(topic))
	produce := func(i int) {
		if err := cl.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Value: make([]byte, 5000), Key: []byte(fmt.Sprint(i))}).FirstErr(); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	goroutines := func() int {
		var n int
		for range 20 { // settle: let closed connections' goroutines end
			runtime.GC()
			time.Sleep(100 * time.Millisecond)
			n = runtime.NumGoroutine()
		}
		return n
	}
	produce(0)
	reload := func(i int) {
		c := cfg
		c.Listen = srv.Addr()
		c.Interceptors = []interceptor.Spec{largeMessageSpec(topic, storeURL, "large.message.threshold.bytes="+fmt.Sprint(1000+i))}
		if err := srv.Reload(ctxT(t, time.Minute), c); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		produce(i)
	}
	for i := 1; i <= 5; i++ {
		reload(i)
	}
	before := goroutines()
	const n = 40
	for i := 6; i < 6+n; i++ {
		reload(i)
	}
	after := goroutines()
	t.Logf("goroutines: %d after 5 reloads, %d after %d more", before, after, n)
	if after > before+n/2 {
		t.Fatalf("goroutines grew from %d to %d over %d reloads: old chains' stores leak", before, after, n)
	}
}
