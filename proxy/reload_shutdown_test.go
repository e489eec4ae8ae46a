package proxy

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrykit/ferry/interceptor"
)

// reloadBlock's factory signals blockBuilding and waits for blockRelease:
// a reload whose chain takes long to build (a store that is slow to open).
var (
	blockBuilding = make(chan struct{}, 1)
	blockRelease  = make(chan struct{})
	blockClosed   atomic.Int64
)

func init() {
	interceptor.Register("reload-block", func(_ context.Context, cfg map[string]string) (interceptor.Instance, error) {
		blockBuilding <- struct{}{}
		<-blockRelease
		re, err := interceptor.CompileTopicPattern(cfg[interceptor.KeyTopicPattern])
		if err != nil {
			return interceptor.Instance{}, err
		}
		return interceptor.Instance{Produce: passThrough{re}, Close: func() error { blockClosed.Add(1); return nil }}, nil
	})
}

// A reload whose chain is still being built when Shutdown retires the
// running chain is refused (ErrReloadShutdown), does not panic, and closes
// the chain it built: nothing installs a chain after Shutdown, whose
// interceptors (payload stores) would never be closed.
func TestReloadDuringShutdown(t *testing.T) {
	// Fresh each run (go test -count N: a second close of the same
	// channel panicked).
	blockRelease = make(chan struct{})
	blockClosed.Store(0)
	spec := interceptor.Spec{Name: "reload-test", Config: map[string]string{"topic.pattern": "a.*"}}
	s := reloadServer(t, spec)
	errc := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				errc <- errors.New("Reload panicked")
			}
		}()
		errc <- s.Reload(context.Background(), Config{Upstream: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0",
			Interceptors: []interceptor.Spec{{Name: "reload-block", Config: map[string]string{"topic.pattern": "b.*"}}}})
	}()
	<-blockBuilding
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	close(blockRelease)
	select {
	case err := <-errc:
		if !errors.Is(err, ErrReloadShutdown) {
			t.Fatalf("Reload during Shutdown: %v, want ErrReloadShutdown", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Reload did not return")
	}
	if n := blockClosed.Load(); n != 1 {
		t.Fatalf("the chain built during Shutdown closed %d times, want 1", n)
	}
	if g, _ := s.ChainGeneration(); g != 0 {
		t.Fatalf("generation %d in force after Shutdown, want none", g)
	}
}
