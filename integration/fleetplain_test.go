package integration

// The plain proxy's streamed Fetch responses (proxy/fetchstream.go) under
// the fleet's faults: a fourth `ferry proxy` replica with no interceptors
// (a port per broker) serves a reader that, again and again through every
// phase, reads the fleet's topic from its first offset to the end offsets
// of the moment it starts. Its responses are written to it as they arrive
// (record sets over 32 KiB spliced socket to socket) and their KIP-951
// endpoints rewritten in place while leaders move, brokers restart, join
// and leave. Every pass must read every offset; a record must read the
// same in every pass and the same as straight from the cluster at the end;
// the reader must never dial anything but the replica's own ports (a
// broker's real endpoint in a response would send it there).

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// plainPassBound bounds one pass of the reader (a rolling restart may hold
// it up for a while; the client retries).
const plainPassBound = 4 * time.Minute

type plainReader struct {
	f     *fleet
	proxy *proxyReplica
	adm   *kadm.Client // straight to the cluster
	base  int          // the replica's ports: base (bootstrap) to base+31
	stop  chan struct{}
	halt  sync.Once // closes stop
	done  chan struct{}

	mu        sync.Mutex
	seen      map[loadPos][32]byte // what passes read at each offset (digest)
	passes    map[string]int       // completed passes, by the phases each overlapped
	faults    []string
	fetchErrs int
	maxBytes  int             // the most record bytes a pass read from one partition
	total     int             // whole passes
	logged    map[string]bool // phases whose end offsets failed (logged once); the passes' goroutine only
}

// startPlainReader starts the plain replica (upstream: the cluster's
// brokers) and the reader's passes.
func startPlainReader(f *fleet, bin, brokers string) *plainReader {
	base := freePortBlock(f.t, 32)
	r := &plainReader{f: f, base: base, stop: make(chan struct{}), done: make(chan struct{}),
		seen: map[loadPos][32]byte{}, passes: map[string]int{}, logged: map[string]bool{}}
	// Its own client straight to the cluster: the fleet's is the faults'.
	r.adm = kadm.NewClient(client(f.t))
	r.proxy = startProxyReplica(f.t, bin, fmt.Sprintf(`
upstream: [%s]
listen: 127.0.0.1:%d
broker.port.base: %d
admin.listen: 127.0.0.1:0
`, brokers, base, base))
	// A test that ends early stops the passes too (they log through t).
	f.t.Cleanup(func() {
		r.halt.Do(func() { close(r.stop) })
		<-r.done
	})
	go func() {
		defer close(r.done)
		for {
			r.pass()
			select {
			case <-r.stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return r
}

func (r *plainReader) fault(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.faults) < 20 {
		r.faults = append(r.faults, fmt.Sprintf(format, args...))
	}
}

// OnBrokerConnect (kgo.HookBrokerConnect): every address the reader dials
// is one of the replica's.
func (r *plainReader) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, _ error) {
	if meta.Host != "127.0.0.1" || int(meta.Port) < r.base || int(meta.Port) >= r.base+32 {
		r.fault("the reader dialled %s (node %d), not one of the plain proxy's ports %d-%d",
			net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))), meta.NodeID, r.base, r.base+31)
	}
}

// recordDigest is what a record reads as: key, value, headers, timestamp.
func recordDigest(rec *kgo.Record) [32]byte {
	h := sha256.New()
	field := func(b []byte) {
		h.Write(binary.AppendVarint(nil, int64(len(b))))
		h.Write(b)
	}
	field(rec.Key)
	field(rec.Value)
	for _, hd := range rec.Headers {
		field([]byte(hd.Key))
		field(hd.Value)
	}
	h.Write(binary.AppendVarint(nil, rec.Timestamp.UnixMilli()))
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// pass reads the topic through the plain replica from the first offset of
// each partition to its end offset when the pass starts.
func (r *plainReader) pass() {
	f := r.f
	phase := *f.load.phase.Load()
	ctx, cancel := context.WithTimeout(context.Background(), plainPassBound)
	defer cancel()
	// Partitions whose leader cannot answer now (a broker killed) are
	// left to the next pass.
	ends, err := r.adm.ListEndOffsets(ctx, f.topic)
	if err != nil && !r.logged[phase] {
		r.logged[phase] = true
		f.t.Logf("%s: plain reader: end offsets: %v (such partitions wait for a later pass; logged once per phase)", phase, err)
	}
	want := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			want[o.Partition] = o.Offset
			from[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(want) == 0 {
		return
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(net.JoinHostPort("127.0.0.1", strconv.Itoa(r.base))),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{f.topic: from}),
		kgo.FetchMaxBytes(16<<20), kgo.MetadataMaxAge(5*time.Second), kgo.WithHooks(r))
	if err != nil {
		r.fault("%s: plain reader client: %v", phase, err)
		return
	}
	defer cl.Close()
	got := map[int32]map[int64]bool{}
	size := map[int32]int{}
	complete := func() bool {
		for p, n := range want {
			if int64(len(got[p])) < n {
				return false
			}
		}
		return true
	}
	// The phases the pass overlapped: each gets it counted.
	during := map[string]bool{phase: true}
	for !complete() {
		fs := cl.PollFetches(ctx)
		during[*f.load.phase.Load()] = true
		if ctx.Err() != nil {
			var short []string
			for p, n := range want {
				if int64(len(got[p])) < n {
					short = append(short, fmt.Sprintf("partition %d: %d of %d", p, len(got[p]), n))
				}
			}
			r.fault("%s: a pass through the plain proxy read %v after %s", phase, short, plainPassBound)
			return
		}
		r.mu.Lock()
		fs.EachError(func(string, int32, error) { r.fetchErrs++ })
		fs.EachRecord(func(rec *kgo.Record) {
			if rec.Offset >= want[rec.Partition] {
				return // past the pass's end: the next pass reads it
			}
			at := loadPos{rec.Partition, rec.Offset}
			d := recordDigest(rec)
			if prev, ok := r.seen[at]; ok && prev != d {
				if len(r.faults) < 20 {
					r.faults = append(r.faults, fmt.Sprintf("%s: partition %d offset %d read differently than in an earlier pass", phase, at.p, at.o))
				}
			}
			r.seen[at] = d
			if got[rec.Partition] == nil {
				got[rec.Partition] = map[int64]bool{}
			}
			got[rec.Partition][rec.Offset] = true
			size[rec.Partition] += len(rec.Key) + len(rec.Value)
		})
		r.mu.Unlock()
	}
	during[*f.load.phase.Load()] = true
	r.mu.Lock()
	r.total++
	for p := range during {
		r.passes[p]++
	}
	for _, n := range size {
		r.maxBytes = max(r.maxBytes, n)
	}
	r.mu.Unlock()
}

// finish stops the passes and checks what they read against the cluster
// read straight, and that every phase saw a whole pass.
func (r *plainReader) finish(phases []string) {
	t := r.f.t
	r.halt.Do(func() { close(r.stop) })
	select {
	case <-r.done:
	case <-time.After(plainPassBound + time.Minute):
		t.Fatalf("the plain reader's last pass did not end")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, fl := range r.faults {
		t.Errorf("plain proxy: %s", fl)
	}
	for _, p := range phases {
		if r.passes[p] == 0 {
			t.Errorf("plain proxy: no whole pass overlapped phase %s (passes by phase: %v)", p, r.passes)
		}
	}
	// Each record read through the plain proxy, against the same offset
	// read straight from the cluster.
	want := map[int32]int64{}
	for at := range r.seen {
		want[at.p] = max(want[at.p], at.o+1)
	}
	from := map[int32]kgo.Offset{}
	for p := range want {
		from[p] = kgo.NewOffset().AtStart()
	}
	direct := client(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.f.topic: from}), kgo.FetchMaxBytes(16<<20))
	ctx := ctxT(t, 3*time.Minute)
	checked, differ := 0, 0
	read := map[int32]int64{}
	for p, n := range want {
		for read[p] < n {
			fs := direct.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("reading the topic straight from the cluster: partition %d at %d of %d", p, read[p], n)
			}
			fs.EachRecord(func(rec *kgo.Record) {
				read[rec.Partition] = max(read[rec.Partition], rec.Offset+1)
				d, ok := r.seen[loadPos{rec.Partition, rec.Offset}]
				if !ok {
					return
				}
				checked++
				if d != recordDigest(rec) {
					differ++
					if differ <= 5 {
						t.Errorf("plain proxy: partition %d offset %d read differently than straight from the cluster", rec.Partition, rec.Offset)
					}
				}
			})
		}
	}
	if checked != len(r.seen) {
		t.Errorf("plain proxy: %d of the %d offsets read through it were found straight from the cluster", checked, len(r.seen))
	}
	// The responses were streamed: some held record sets over the 32 KiB
	// the proxy splices.
	fams := scrape(t, r.proxy.adminAddr())
	streamed := metricValue(fams, "ferry_proxy_fetch_responses_streamed_total", nil)
	rewritten := metricValue(fams, "ferry_proxy_address_rewrites_total", map[string]string{"api": "Fetch"})
	if streamed <= 0 || r.maxBytes < 64<<10 {
		t.Errorf("plain proxy: %v Fetch responses streamed, at most %d record bytes of one partition in a pass: the streamed path was not tried", streamed, r.maxBytes)
	}
	r.f.checkLog = append(r.f.checkLog, fmt.Sprintf("plain proxy (no interceptors): %d whole passes over the topic (%v by the phases they overlapped), %d offsets each read the same in every pass and as straight from the cluster, up to %d record bytes of a partition per pass, %v Fetch responses streamed, %v with their endpoints rewritten, %d fetch errors retried, no real broker dialled",
		r.total, r.passes, checked, r.maxBytes, streamed, max(rewritten, 0), r.fetchErrs))
}
