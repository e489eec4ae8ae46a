package interceptor

import (
	"sync"
	"testing"
	"time"
)

// The pool runs jobs handed to it at once, each beside the others (a busy
// worker never delays a job), reuses a worker that waits, and a worker
// idle for its bound ends (the next job starts a new one). Steady traffic
// after a burst keeps only the workers it needs (TestWorkerPoolShrinks).
func TestWorkerPool(t *testing.T) {
	p := &workerPool{idleFor: 500 * time.Millisecond}
	const n = maxParallelPartitions
	burst(t, p, n)
	if got := p.started.Load(); got != n {
		t.Fatalf("%d workers started for %d jobs running at once", got, n)
	}
	// The workers now wait for jobs: one is handed to one of them. A
	// worker that has not reached its wait yet is not a fault (do starts
	// another), so the hand-off is tried until one takes it, within the
	// idle bound's margin.
	var ran sync.WaitGroup
	for tries := 1; ; tries++ {
		before := p.started.Load()
		ran.Add(1)
		p.do(ran.Done)
		waitOrFail(t, &ran, "a job on a waiting worker")
		if p.started.Load() == before {
			break // a waiting worker took it
		}
		if tries == 10 {
			t.Fatalf("no waiting worker took a job in %d tries", tries)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Idle past the bound, every worker ends: the next job starts one.
	deadline := time.Now().Add(time.Minute)
	for {
		before := p.started.Load()
		time.Sleep(3 * p.idleFor)
		ran.Add(1)
		p.do(ran.Done)
		waitOrFail(t, &ran, "a job after the workers went idle")
		if p.started.Load() == before+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle workers still took jobs after %s", time.Minute)
		}
	}
}

// burst hands p n jobs that each return only once all n have started (so
// they run side by side), and waits for them to end.
func burst(t *testing.T, p *workerPool, n int) {
	t.Helper()
	var all, started sync.WaitGroup
	all.Add(n)
	started.Add(n)
	release := make(chan struct{})
	for range n {
		p.do(func() {
			defer all.Done()
			started.Done()
			<-release
		})
	}
	waitOrFail(t, &started, "a burst's jobs to start side by side")
	close(release)
	waitOrFail(t, &all, "a burst's jobs to end")
}

func waitOrFail(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
	}
}

// After a burst, jobs one at a time go to the worker that became idle last,
// so the others end after the idle time while traffic goes on (a pool that
// handed jobs round the idle workers kept every one alive: found by a
// helper, 184 workers kept by 7 workers' worth of traffic).
func TestWorkerPoolShrinks(t *testing.T) {
	p := &workerPool{idleFor: 200 * time.Millisecond}
	const n = 16
	burst(t, p, n)
	if got := p.live.Load(); got != n {
		t.Fatalf("%d workers live after a burst of %d", got, n)
	}
	// Steady traffic: a job every 10 ms, one at a time, until the pool
	// is down to what it needs (within a bound far above the idle time).
	deadline := time.Now().Add(time.Minute)
	var ran sync.WaitGroup
	for p.live.Load() > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers still live after a minute of one job at a time (idle time %s)", p.live.Load(), p.idleFor)
		}
		ran.Add(1)
		p.do(ran.Done)
		waitOrFail(t, &ran, "a job of the steady traffic")
		time.Sleep(10 * time.Millisecond)
	}
}
