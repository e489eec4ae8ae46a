package proxy

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrykit/ferry/interceptor"
)

var stormBuilt, stormClosed atomic.Int64

func init() {
	interceptor.Register("reload-storm", func(_ context.Context, cfg map[string]string) (interceptor.Instance, error) {
		re, err := interceptor.CompileTopicPattern(cfg[interceptor.KeyTopicPattern])
		if err != nil {
			return interceptor.Instance{}, err
		}
		stormBuilt.Add(1)
		return interceptor.Instance{Produce: passThrough{re}, Close: func() error { stormClosed.Add(1); return nil }}, nil
	})
}

// A storm of reloads (good and refused ones) while requests take and drop
// the chain: every chain built is closed exactly once by the end of
// Shutdown, the chain in force stays open until then, and no goroutine is
// left behind.
func TestReloadStormClosesEveryChain(t *testing.T) {
	spec := func(i int) interceptor.Spec {
		return interceptor.Spec{Name: "reload-storm", Config: map[string]string{"topic.pattern": "t" + strconv.Itoa(i) + ".*"}}
	}
	goroutines := runtime.NumGoroutine()
	s, err := New(Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Interceptors: []interceptor.Spec{spec(0)},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				g := s.acquireChain()
				if g == nil {
					return
				}
				runtime.Gosched()
				g.release()
			}
		}()
	}
	const n = 300
	for i := 1; i <= n; i++ {
		cfg := Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0", Interceptors: []interceptor.Spec{spec(i)}}
		if i%10 == 0 {
			cfg.Interceptors[0].Config["topic.pattern"] = "(" // refused
		}
		_ = s.Reload(context.Background(), cfg)
	}
	close(stop)
	wg.Wait()
	if open := stormBuilt.Load() - stormClosed.Load(); open != 1 {
		t.Fatalf("after the storm %d chains built, %d closed: %d open, want 1 (the one in force)", stormBuilt.Load(), stormClosed.Load(), open)
	}
	if gen, _ := s.ChainGeneration(); gen != 1+n-n/10 {
		t.Fatalf("generation %d, want %d", gen, 1+n-n/10)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if stormBuilt.Load() != stormClosed.Load() {
		t.Fatalf("after Shutdown %d chains built, %d closed", stormBuilt.Load(), stormClosed.Load())
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutines+5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > goroutines+5 {
		t.Fatalf("%d goroutines after Shutdown, %d before New", g, goroutines)
	}
}
