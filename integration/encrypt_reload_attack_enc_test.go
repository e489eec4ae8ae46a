package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/proxy"
)

// Security review of issue #13 (held): hot reloads of a proxy's encrypt
// interceptor while 4 producers produce through it, the key switching
// between the real KMS's two keys each time (the other one listed for
// decryption), data keys rotating every 3 records: every record acknowledged
// is on the broker sealed, and reads back through the proxy byte for byte.
func TestAttackEncReloadWhileProducing(t *testing.T) {
	keyA, keyB := encryptKeyURL(t), storeOrRandomKey(t)
	topic := clientTopic(t, 3, nil)
	spec := func(cur, old string) interceptor.Spec {
		return encryptSpec(topic, cur, interceptor.KeyEncryptDecryptKeyURLs+"="+old, interceptor.KeyEncryptDataKeyMaxUses+"=3")
	}
	srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), Listen: "127.0.0.1:0", Interceptors: []interceptor.Spec{spec(keyA, keyB)}})
	via := srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var mu sync.Mutex
	want := map[string][]byte{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for p := range 4 {
		cl := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("p%d-%d", p, i)
				v := bytes.Repeat([]byte(k+"|"), 20+i%50)
				if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(k), Value: v}).FirstErr(); err != nil {
					t.Errorf("produce %s: %v", k, err)
					return
				}
				mu.Lock()
				want[k] = v
				mu.Unlock()
			}
		}()
	}
	for i := range 12 {
		time.Sleep(150 * time.Millisecond)
		cur, old := keyA, keyB
		if i%2 == 0 {
			cur, old = keyB, keyA
		}
		cfg := proxy.Config{Upstream: proxy.SplitList(brokers(t)), Listen: "127.0.0.1:0", Interceptors: []interceptor.Spec{spec(cur, old)}}
		if err := srv.Reload(ctx, cfg); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	n := len(want)
	t.Logf("%d records produced across 12 reloads", n)
	for _, r := range consumeRaw(t, topic, n) {
		if !envelope.IsSealed(r.Value) {
			t.Fatalf("record %q on the broker is not sealed", r.Key)
		}
	}
	got := proxyRecords(t, via, topic, n)
	for _, r := range got {
		if w, ok := want[string(r.Key)]; !ok || !bytes.Equal(w, r.Value) || len(r.Headers) != 0 {
			t.Fatalf("record %q through the proxy: %q headers %v", r.Key, r.Value, r.Headers)
		}
	}
}

// storeOrRandomKey is the real KMS's "other" key when the servers run,
// else a base64key:// key.
func storeOrRandomKey(t *testing.T) string {
	if os.Getenv("FERRY_KMS_KEY_URL_OTHER") != "" {
		return storetest.KMSKeyURL(t, "other")
	}
	return encryptKeyURL(t)
}
