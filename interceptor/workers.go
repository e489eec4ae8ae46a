package interceptor

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// workerIdle is how long a partition worker waits for its next job before
// it ends.
const workerIdle = 10 * time.Second

// partitionWorkers runs a Produce request's partitions beside the
// request's own goroutine (InterceptProduce) on goroutines that outlive
// the request. A goroutine started per partition began with a small stack
// and grew it on every request as the partition's calls went deep
// (batch decoding, sealing): runtime.newstack was 5.8 % of `encrypt`'s
// produce CPU behind Kafka's perf producer (docs/BENCHMARKS.md). A worker
// keeps its grown stack from one job to the next.
//
// The pool holds no limit of its own: InterceptProduce bounds the jobs of
// a request (maxParallelPartitions), and the proxy the requests in flight.
// A job goes to the worker that became idle last, so steady traffic keeps
// as many workers busy as it needs and the others, idle for workerIdle,
// end: a burst leaves no goroutines behind.
var partitionWorkers workerPool

type workerPool struct {
	idleFor time.Duration // how long a worker waits for a job; 0: workerIdle
	started atomic.Int64  // workers started so far
	live    atomic.Int64  // workers running now

	mu   sync.Mutex
	idle []*worker // waiting for a job, the most recently idle last
}

// worker is one goroutine of the pool; job hands it its next job.
type worker struct{ job chan func() }

// do runs job on the worker that became idle last, or on a new one when
// none waits.
func (p *workerPool) do(job func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.job <- job // buffered: a worker taken off idle receives exactly one job
		return
	}
	p.mu.Unlock()
	p.started.Add(1)
	p.live.Add(1)
	go p.work(&worker{job: make(chan func(), 1)}, job)
}

// work runs job, then the jobs handed to w, until it has waited for one
// for the pool's idle time.
func (p *workerPool) work(w *worker, job func()) {
	defer p.live.Add(-1)
	wait := p.idleFor
	if wait == 0 {
		wait = workerIdle
	}
	idle := time.NewTimer(wait)
	defer idle.Stop()
	for {
		job()
		job = nil // holds nothing of the request while it waits
		p.mu.Lock()
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		idle.Reset(wait) // Go 1.23+: no stale tick is left to drain
		select {
		case job = <-w.job:
			continue
		case <-idle.C:
		}
		p.mu.Lock()
		if i := slices.Index(p.idle, w); i >= 0 {
			p.idle = slices.Delete(p.idle, i, i+1)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		// Taken off idle by do as the timer fired: its job is on the way.
		job = <-w.job
	}
}
