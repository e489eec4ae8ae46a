package integration

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/proxy"
)

// gocloud's Keeper.Close waits for the keeper's calls in flight, so
// envelope.Keyring.Close blocks while a KMS call is slow. The proxy closes
// a chain's keyrings only when nothing holds the chain (the last request
// of a retired generation, or Shutdown once its connections ended), and a
// request's KMS call ends with its context (the connection's, cancelled at
// shutdown.timeout.ms): a KMS that never answers does not hold Shutdown
// past its deadline.
func TestEncryptSlowKMSShutdownBounded(t *testing.T) {
	direct := storetest.KMSKeyURL(t, "")
	endpoint := storetest.NeedEnv(t, "FERRY_KMS_ENDPOINT")[0]
	up, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(up)
	hung := make(chan struct{}, 16)
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") == "TrentService.Encrypt" {
			io.Copy(io.Discard, r.Body)
			hung <- struct{}{}
			select { // a KMS that does not answer
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer srv.Close()
	du, _ := url.Parse(direct)
	q := du.Query()
	q.Set("endpoint", srv.URL)
	du.RawQuery = q.Encode()
	topic := newTopic(t, nil)
	s, err := proxy.New(proxy.Config{Upstream: realAddrs(t), Listen: "127.0.0.1:0", InterceptorTimeout: time.Minute,
		Logger:       slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Interceptors: []interceptor.Spec{{Name: "encrypt", Config: map[string]string{"topic.pattern": topic, interceptor.KeyEncryptKeyURL: du.String()}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cl.Produce(context.Background(), &kgo.Record{Value: []byte("v")}, nil)
	select {
	case <-hung:
	case <-time.After(30 * time.Second):
		t.Fatal("no KMS Encrypt was asked")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown with a 1s deadline took %v while a KMS call hung", d.Round(time.Millisecond))
	}
	t.Logf("Shutdown took %v with a KMS call hung", time.Since(start).Round(time.Millisecond))
}
