package interceptor

import (
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
// A worker idle for workerIdle ends, so a burst leaves no goroutines
// behind.
var partitionWorkers = workerPool{jobs: make(chan func())}

type workerPool struct {
	jobs    chan func()   // unbuffered: a send succeeds only when a worker waits
	idle    time.Duration // how long a worker waits for a job; 0: workerIdle
	started atomic.Int64  // workers started so far
}

// do runs job on an idle worker, or on a new one when none waits.
func (p *workerPool) do(job func()) {
	select {
	case p.jobs <- job:
	default:
		p.started.Add(1)
		go p.work(job)
	}
}

// work runs job, then the jobs handed to it, until it has waited p.idle
// for one.
func (p *workerPool) work(job func()) {
	wait := p.idle
	if wait == 0 {
		wait = workerIdle
	}
	idle := time.NewTimer(wait)
	defer idle.Stop()
	for {
		job()
		idle.Reset(wait) // Go 1.23+: no stale tick is left to drain
		select {
		case job = <-p.jobs:
		case <-idle.C:
			return
		}
	}
}
