package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
)

// span is the part of one partition to read: [start, end).
type span struct{ start, end int64 }

// offsets is one offset per partition.
type offsets map[int32]int64

// listOffsets returns one of the List*Offsets of topic as a map; which names
// it in errors.
func listOffsets(ctx context.Context, topic, which string, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (offsets, error) {
	los, err := list(ctx, topic)
	if err == nil {
		err = los.Error()
	}
	if err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil, fmt.Errorf("gc: topic %s does not exist", topic)
		}
		return nil, fmt.Errorf("gc: topic %s: listing %s: %w", topic, which, err)
	}
	out := make(offsets)
	los.Each(func(lo kadm.ListedOffset) { out[lo.Partition] = lo.Offset })
	if len(out) == 0 {
		return nil, fmt.Errorf("gc: topic %s does not exist", topic)
	}
	return out, nil
}

// groups splits the partitions that have something to read into at most
// workers groups of about equal numbers of records, each read by its own
// client.
func groups(spans map[int32]span, workers int) [][]int32 {
	var ps []int32
	for p, sp := range spans {
		if sp.start < sp.end {
			ps = append(ps, p)
		}
	}
	if workers < 1 {
		workers = 1
	}
	workers = min(workers, len(ps))
	if workers == 0 {
		return nil
	}
	// Largest first, each to the group with the fewest records so far.
	slices.SortFunc(ps, func(a, b int32) int {
		if d := (spans[b].end - spans[b].start) - (spans[a].end - spans[a].start); d != 0 {
			if d < 0 {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	out := make([][]int32, workers)
	load := make([]int64, workers)
	for _, p := range ps {
		i := slices.Index(load, slices.Min(load))
		out[i] = append(out[i], p)
		load[i] += spans[p].end - spans[p].start
	}
	return out
}

// defaultWorkers is the number of clients reading a topic in parallel when
// Options.ReadWorkers is 0: max(2, GOMAXPROCS), at most 8 (each client
// buffers up to one fetch of fetchMaxBytes).
func defaultWorkers() int { return min(8, max(2, runtime.GOMAXPROCS(0))) }

// readGroups reads spans of topic, group g's partitions by its own client in
// its own goroutine, and calls handle(g, r) from that goroutine for every
// record (control records excluded) whose offset lies in its partition's
// span, read with read_uncommitted (records of aborted and open
// transactions included: a consumer with Kafka's default isolation level
// reads them). progress is called from the calling goroutine with the
// number of records handled so far. It returns that number.
//
// A partition is done once a record (control records included) at or past
// its end-1 is seen. A group that makes no progress for maxIdlePolls poll
// timeouts fails the read, naming the partition and offset; the first error
// of any group stops all of them.
func readGroups(ctx context.Context, cl *kgo.Client, topic string, spans map[int32]span, gs [][]int32,
	handle func(g int, r *kgo.Record) error, progress func(int64)) (int64, error) {
	var read atomic.Int64
	eg, gctx := errgroup.WithContext(ctx)
	for g, ps := range gs {
		eg.Go(func() error {
			return readGroup(gctx, cl, topic, spans, ps, &read, func(r *kgo.Record) error { return handle(g, r) })
		})
	}
	done := make(chan error, 1)
	go func() { done <- eg.Wait() }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			progress(read.Load())
			return read.Load(), err
		case <-tick.C:
			progress(read.Load())
		}
	}
}

func readGroup(ctx context.Context, cl *kgo.Client, topic string, spans map[int32]span, ps []int32,
	read *atomic.Int64, handle func(*kgo.Record) error) error {
	assign := make(map[int32]kgo.Offset)
	pending := make(map[int32]int64) // partition -> the next offset expected
	for _, p := range ps {
		assign[p] = kgo.NewOffset().At(spans[p].start)
		pending[p] = spans[p].start
	}
	rc, err := kgo.NewClient(append(cl.Opts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: assign}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxBytes(fetchMaxBytes),
		kgo.FetchMaxPartitionBytes(fetchMaxPartitionBytes),
	)...)
	if err != nil {
		return fmt.Errorf("gc: kafka client to read topic %s: %w", topic, err)
	}
	defer rc.Close()
	lastProgress := time.Now()
	for len(pending) > 0 {
		pctx, cancel := context.WithTimeout(ctx, pollTimeout)
		fs := rc.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				where := fmt.Sprintf("topic %s partition %d", t, p)
				if t == "" { // franz-go's error of a whole fetch response
					where = "from the brokers"
				}
				ferr = fmt.Errorf("gc: fetching %s: %w", where, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		progressed := false
		var n int64
		for _, r := range fs.Records() {
			next, ok := pending[r.Partition]
			if !ok || r.Offset < next {
				continue // past the end read, or seen
			}
			progressed = true
			pending[r.Partition] = r.Offset + 1
			end := spans[r.Partition].end
			if r.Offset >= end-1 {
				delete(pending, r.Partition)
				// Records produced since the bounds were taken are not
				// wanted: stop fetching them.
				rc.PauseFetchPartitions(map[string][]int32{topic: {r.Partition}})
			}
			if r.Offset >= end || r.Attrs.IsControl() {
				continue
			}
			n++
			if err := handle(r); err != nil {
				return err
			}
		}
		read.Add(n)
		if progressed {
			lastProgress = time.Now()
			continue
		}
		if time.Since(lastProgress) >= maxIdlePolls*pollTimeout {
			p, next := firstPending(pending)
			return fmt.Errorf("gc: reading topic %s stalled at partition %d offset %d (end %d): no progress for %s",
				topic, p, next, spans[p].end, time.Duration(maxIdlePolls)*pollTimeout)
		}
	}
	return nil
}

func firstPending(pending map[int32]int64) (int32, int64) {
	ps := make([]int32, 0, len(pending))
	for p := range pending {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps[0], pending[ps[0]]
}
