package integration

import (
	"crypto/sha256"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
)

// The workload (issue 19): 2–8 MiB payloads read with
// Consumer.PollRecords(ctx, 50). Each poll's resolved bytes stay within
// large.message.consumer.poll.max.bytes, the records come back in order and
// byte for byte, and the peak heap and RSS of the consuming half are logged.
func TestPollRecordsByteBound(t *testing.T) {
	const (
		records = 40
		bound   = 24 << 20
	)
	e := setup(t, 1<<20)
	topic := newTopic(t, nil)
	size := func(i int) int { return 2<<20 + (i*7919%7)*(1<<20) + i } // 2–8 MiB
	sums := make([][32]byte, records)
	for i := range records {
		v := randomBytes(uint64(i), size(i))
		sums[i] = sha256.Sum256(v)
		produceOK(t, e, &kgo.Record{Topic: topic, Key: []byte(strconv.Itoa(i)), Value: v})
	}
	runtime.GC()
	debug.FreeOSMemory()
	resetPeakRSS(t)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapBefore := ms.HeapInuse >> 20

	cl := client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	cons := largemessage.NewConsumer(cl, largemessage.NewDeserializer(e.store, false)).WithPollMaxBytes(bound)
	ctx := ctxT(t, 3*time.Minute)
	stopHeap := sampleHeap()
	got, polls, heldSeen := 0, 0, false
	for got < records {
		recs, err := cons.PollRecords(ctx, 50)
		if err != nil {
			t.Fatalf("poll after %d records: %v", got, err)
		}
		polls++
		var n int64
		for _, r := range recs {
			if r.Err != nil {
				t.Fatalf("record %d: %v", got, r.Err)
			}
			if string(r.Key) != strconv.Itoa(got) || sha256.Sum256(r.Value) != sums[got] {
				t.Fatalf("record %d: key %q, value of %d bytes differs", got, r.Key, len(r.Value))
			}
			n += int64(len(r.Key) + len(r.Value))
			got++
		}
		if len(recs) > 1 && n > bound {
			t.Fatalf("poll %d returned %d records of %d resolved bytes, over the bound of %d", polls, len(recs), n, bound)
		}
		if cons.Held() > 0 {
			heldSeen = true
		}
	}
	if !heldSeen {
		t.Fatalf("no poll held records back: the workload (%d records of 2–8 MiB) never met the bound of %d bytes", records, bound)
	}
	peak := stopHeap()
	// The records of two polls (the caller's last and the one resolving)
	// and the garbage collector's slack (GOGC=100: up to twice the live
	// heap): a poll's payloads kept reachable after the caller dropped
	// them would take it to the whole workload (200 MiB and more).
	if limit := float64(4*bound+32<<20) / (1 << 20); peak > limit {
		t.Errorf("peak heap %.0f MiB, over %.0f MiB (4 × poll.max.bytes + 32 MiB)", peak, limit)
	}
	t.Logf("%d records of 2–8 MiB in %d polls with poll.max.bytes %d MiB: peak heap in use %.0f MiB (%d MiB before the first poll), peak RSS of the test process since production %.0f MiB",
		records, polls, bound>>20, peak, heapBefore, rssMiB("VmHWM"))
}
