// Command benchclient is the franz-go client of scripts/bench huge and
// scripts/bench fetchers: plain kgo, no Ferry library, so whatever it sends
// and reads goes through `ferry proxy` as any client's would.
//
//	benchclient create  -brokers B -topic T [-partitions 1]
//	benchclient produce -brokers B -topic T -in FILE [-count 1]
//	benchclient consume -brokers B -topic T -out FILE
//	benchclient fetchers -brokers B -topic T -consumers N -limit BYTES -records R
//	                     [-closers C] [-timeout 120s]
//
// produce sends FILE's bytes as the value of -count records (acks=all, no
// compression) and waits for each acknowledgement; consume writes the first
// record's value to FILE. Both raise franz-go's request, batch and fetch
// limits to fit the record. fetchers starts N consumers at once, each
// reading the topic from the start with fetch.max.bytes and
// max.partition.fetch.bytes of BYTES until it has R records or -timeout
// passes, plus C consumers that each close their client in the middle of a
// fetch (after 50..500 ms), again and again until the N are done. It prints
// one line: "fetchers consumers=N records=TOTAL seconds=S records/s=X
// complete=K" (K: consumers that read all R), and exits 1 when K < N.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchclient create|produce|consume|fetchers [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	brokers := fs.String("brokers", "", "bootstrap address")
	topic := fs.String("topic", "", "topic")
	partitions := fs.Int("partitions", 1, "create: partitions")
	in := fs.String("in", "", "produce: the value's file")
	count := fs.Int("count", 1, "produce: records")
	out := fs.String("out", "", "consume: where the value goes")
	consumers := fs.Int("consumers", 1, "fetchers: consumers reading everything")
	closers := fs.Int("closers", 0, "fetchers: consumers closing mid-fetch")
	limit := fs.Int("limit", 50<<20, "fetchers: fetch.max.bytes and max.partition.fetch.bytes")
	records := fs.Int("records", 1, "fetchers: records each consumer reads")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after")
	_ = fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch os.Args[1] {
	case "create":
		err = create(ctx, *brokers, *topic, int32(*partitions))
	case "produce":
		err = produce(ctx, *brokers, *topic, *in, *count)
	case "consume":
		err = consume(ctx, *brokers, *topic, *out)
	case "fetchers":
		err = fetchers(ctx, *brokers, *topic, *consumers, *closers, int32(*limit), *records)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchclient:", err)
		os.Exit(1)
	}
}

// big: franz-go's limits raised as far as it allows (requests and responses
// of 1 GiB), for records up to about 1 GiB.
func big(brokers string, limit int32, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers),
		kgo.BrokerMaxWriteBytes(1 << 30), kgo.BrokerMaxReadBytes(1 << 30),
		kgo.ProducerBatchMaxBytes(1<<30 - 1<<20), kgo.MaxBufferedBytes(2_000_000_000),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProduceRequestTimeout(10 * time.Minute), kgo.RequestTimeoutOverhead(10 * time.Minute),
		kgo.FetchMaxBytes(limit), kgo.FetchMaxPartitionBytes(limit),
	}, opts...)...)
}

func create(ctx context.Context, brokers, topic string, partitions int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		return err
	}
	defer cl.Close()
	res, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil {
		err = res.Err
	}
	return err
}

func produce(ctx context.Context, brokers, topic, in string, count int) error {
	value, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	cl, err := big(brokers, 1<<30-1<<20, kgo.DefaultProduceTopic(topic), kgo.RecordRetries(3))
	if err != nil {
		return err
	}
	defer cl.Close()
	for range count {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(); err != nil {
			return err
		}
	}
	return nil
}

func consume(ctx context.Context, brokers, topic, out string) error {
	cl, err := big(brokers, 1<<30-1<<20, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollRecords(ctx, 1)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) { ferr = fmt.Errorf("%s[%d]: %w", t, p, err) })
		if ferr != nil {
			return ferr
		}
		if recs := fs.Records(); len(recs) > 0 {
			return os.WriteFile(out, recs[0].Value, 0o644)
		}
	}
}

func fetchers(ctx context.Context, brokers, topic string, n, closers int, limit int32, records int) error {
	var total atomic.Int64
	var complete atomic.Int32
	done := make(chan struct{})
	var wg, cwg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Go(func() {
			cl, err := big(brokers, limit, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				fmt.Fprintln(os.Stderr, "benchclient: consumer:", err)
				return
			}
			defer cl.Close()
			got := 0
			for got < records && ctx.Err() == nil {
				fs := cl.PollFetches(ctx)
				fs.EachError(func(t string, p int32, err error) {
					if !errors.Is(err, context.DeadlineExceeded) {
						fmt.Fprintf(os.Stderr, "benchclient: consumer: %s[%d]: %v\n", t, p, err)
					}
				})
				k := len(fs.Records())
				got += k
				total.Add(int64(k))
			}
			if got >= records {
				complete.Add(1)
			}
		})
	}
	for range closers {
		cwg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				cl, err := big(brokers, limit, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
				if err != nil {
					return
				}
				pctx, pcancel := context.WithTimeout(ctx, time.Duration(50+rand.IntN(450))*time.Millisecond)
				cl.PollFetches(pctx)
				pcancel()
				cl.Close() // mid-fetch: the proxy may be downloading the records this fetch asked for
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	close(done)
	cwg.Wait()
	fmt.Printf("fetchers consumers=%d records=%d seconds=%.3f records/s=%.2f complete=%d\n",
		n, total.Load(), secs, float64(total.Load())/secs, complete.Load())
	if int(complete.Load()) < n {
		return fmt.Errorf("%d of %d consumers read all %d records within %v", complete.Load(), n, records, time.Since(start).Round(time.Second))
	}
	return nil
}
