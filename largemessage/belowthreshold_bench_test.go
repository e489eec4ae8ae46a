package largemessage_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var belowSeq atomic.Int64

// BenchmarkBelowThreshold produces 1 KiB records (random bytes, far below
// the threshold: nothing is offloaded) asynchronously until all are
// acknowledged, through plain kgo.Client.Produce ("raw") and through
// largemessage.Producer.Produce over the same client options ("ferry"), on
// a fresh one-partition topic each. cpu-ns/rec is the process's CPU time
// (getrusage: user + system, all threads) per record, over the produce and
// the wait for the acknowledgements. Against the real broker
// (FERRY_KAFKA_BROKERS) that is the client's CPU alone; without it the
// broker is an in-process kfake whose CPU is counted too, which makes the
// two sides look closer than they are.
//
// "interleaved" runs both in one process, in turns of 20,000 records (b.N
// records each), and reports each side's CPU per record and their ratio:
// on a shared machine, whose load changes from one second to the next,
// that ratio moves less than one taken from separate runs.
//
//	go test ./largemessage -run '^$' -bench 'BelowThreshold/interleaved' -benchtime 400000x -count 5
func BenchmarkBelowThreshold(b *testing.B) {
	brokers := strings.Split(os.Getenv("FERRY_KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		brokers = c.ListenAddrs()
	}
	for _, side := range []string{"raw", "ferry"} {
		b.Run(side, func(b *testing.B) {
			run := belowThresholdSide(b, brokers, side == "ferry")
			b.SetBytes(1024)
			b.ResetTimer()
			start := cpuTime()
			run(b.N)
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/rec")
		})
	}
	b.Run("interleaved", func(b *testing.B) {
		raw, ferry := belowThresholdSide(b, brokers, false), belowThresholdSide(b, brokers, true)
		const turn = 20_000
		var rawCPU, ferryCPU time.Duration
		b.SetBytes(2 * 1024)
		b.ResetTimer()
		for done, i := 0, 0; done < b.N; i++ {
			n := min(turn, b.N-done)
			sides := []func(int){raw, ferry}
			cpus := []*time.Duration{&rawCPU, &ferryCPU}
			if i%2 == 1 {
				sides[0], sides[1], cpus[0], cpus[1] = sides[1], sides[0], cpus[1], cpus[0]
			}
			for k := range sides {
				start := cpuTime()
				sides[k](n)
				*cpus[k] += cpuTime() - start
			}
			done += n
		}
		b.StopTimer()
		b.ReportMetric(float64(rawCPU)/float64(b.N), "raw-cpu-ns/rec")
		b.ReportMetric(float64(ferryCPU)/float64(b.N), "ferry-cpu-ns/rec")
		b.ReportMetric(float64(ferryCPU)/float64(rawCPU), "ferry/raw")
	})
}

// belowThresholdSide makes a client (and, for ferry, a Producer over it)
// with a fresh one-partition topic, warms it up and returns a function that
// produces n records and waits for their acknowledgements.
func belowThresholdSide(b *testing.B, brokers []string, ferry bool) func(n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	topic := fmt.Sprintf("below-threshold-%d-%d", time.Now().UnixNano(), belowSeq.Add(1))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { adm.DeleteTopics(context.Background(), topic) })

	produce := cl.Produce
	if ferry {
		cfg := largemessage.DefaultConfig()
		p, err := largemessage.NewProducer(cl, payloadstore.NewMemStore(fmt.Sprintf("below-%d", belowSeq.Add(1)), nil), cfg)
		if err != nil {
			b.Fatal(err)
		}
		produce = p.Produce
	}
	values := make([][]byte, 64)
	r := rand.NewChaCha8([32]byte{3})
	for i := range values {
		values[i] = make([]byte, 1024)
		r.Read(values[i])
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	promise := func(rec *kgo.Record, err error) {
		if err != nil {
			if failed.Add(1) == 1 {
				firstErr.Store(err)
			}
		} else if largemessage.IsOffloaded(rec) {
			failed.Add(1)
			firstErr.Store(fmt.Errorf("a 1 KiB record was offloaded"))
		}
		wg.Done()
	}
	run := func(n int) {
		wg.Add(n)
		for i := range n {
			produce(ctx, &kgo.Record{Topic: topic, Value: values[i%len(values)]}, promise)
		}
		wg.Wait()
		if failed.Load() > 0 {
			b.Fatalf("%d records failed: %v", failed.Load(), firstErr.Load())
		}
	}
	run(2000) // connections, metadata, the topic's limits
	return run
}
