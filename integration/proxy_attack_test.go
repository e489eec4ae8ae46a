package integration

// The proxy's trust boundary against the real broker: every hostile input
// of the issue "The proxy's trust boundary" goes to a `ferry proxy` process
// (the shipped binary, with interceptors), while a canary client keeps
// producing and consuming through it. Each input gets an error or a closed
// connection, the canary never fails, the process lives, and its peak RSS
// stays under the documented bound (docs/SECURITY.md).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// ferryProxy is a `ferry proxy` process started by a test.
type ferryProxy struct {
	cmd       *exec.Cmd
	bootstrap string
	metrics   string
	stderr    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startFerryProxy runs `ferry proxy --config FILE` with yaml as the file and
// waits for its bootstrap and metrics addresses.
func startFerryProxy(t *testing.T, bin, yaml string, env ...string) *ferryProxy {
	t.Helper()
	cfgFile := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfgFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "proxy", "--config", cfgFile, "--log-level", "warn")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &ferryProxy{cmd: cmd, stderr: &syncBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("proxy stderr (last 4 KiB):\n%s", tail([]byte(p.stderr.String())))
		}
	})
	sc := bufio.NewScanner(out)
	deadline := time.After(60 * time.Second)
	lines := make(chan string)
	go func() {
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for p.bootstrap == "" || p.metrics == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("ferry proxy exited: %s", p.stderr.String())
			}
			if a, ok := strings.CutPrefix(l, "ferry proxy: bootstrap "); ok {
				p.bootstrap = strings.Fields(a)[0]
			}
			if a, ok := strings.CutPrefix(l, "ferry proxy: metrics "); ok {
				p.metrics = a
			}
		case <-deadline:
			t.Fatalf("ferry proxy did not start: %s", p.stderr.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	return p
}

// peakRSS is the process's VmHWM in bytes.
func (p *ferryProxy) peakRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("proxy process gone: %v\n%s", err, tail([]byte(p.stderr.String())))
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VmHWM")
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n << 10
}

// metric reads one counter or gauge from the proxy's /metrics.
func (p *ferryProxy) metric(t *testing.T, name string) float64 {
	t.Helper()
	body := httpGet(t, p.metrics)
	var sum float64
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// namedTopic creates topic name on the real broker.
func namedTopic(t *testing.T, name string, configs map[string]*string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(client(t)).CreateTopic(ctx, 1, 1, configs, name)
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic %s: %v %v", name, err, resp.Err)
	}
	return name
}

// rawBatch is a magic v2 batch of one record whose records section is
// given (already compressed with codec).
func rawBatch(records []byte, codec int16, n int32) []byte {
	h := kmsg.RecordBatch{FirstOffset: 0, PartitionLeaderEpoch: -1, Magic: 2, Attributes: codec,
		LastOffsetDelta: n - 1, FirstTimestamp: time.Now().UnixMilli(), MaxTimestamp: time.Now().UnixMilli(),
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: n, Records: records}
	h.Length = int32(49 + len(records))
	b := h.AppendTo(nil)
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// zstdBomb is a records section of one record whose value is n zero bytes,
// zstd-compressed (n = 1 GiB gives about 100 KiB).
func zstdBomb(t *testing.T, n int64) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	var rec []byte
	body := 1 + 1 + 1 + 1 + varintLen(n) + int(n) + 1 // attrs, ts, off, key -1, value len, value, headers
	rec = binary.AppendVarint(rec, int64(body))
	rec = append(rec, 0, 0, 0)
	rec = binary.AppendVarint(rec, -1)
	rec = binary.AppendVarint(rec, n)
	if _, err := enc.Write(rec); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(zero)) {
		if _, err := enc.Write(zero[:min(int64(len(zero)), left)]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := enc.Write([]byte{0}); err != nil { // no headers
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func varintLen(n int64) int { return len(binary.AppendVarint(nil, n)) }

// rawProduce sends a Produce request whose partitions carry the given
// record sets, through cl (any version the broker and proxy agree on),
// and returns the partition error codes by topic.
func rawProduce(t *testing.T, cl *kgo.Client, sets map[string][]byte, byID map[[16]byte][]byte) map[string]int16 {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Acks = -1
	req.TimeoutMillis = 30000
	for topic, recs := range sets {
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = recs
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	for id, recs := range byID {
		rt := kmsg.NewProduceRequestTopic()
		rt.TopicID = id
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Records = recs
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var r kmsg.Request = req
	if len(byID) == 0 {
		r = &pinned{Request: req, v: 12} // topics by name: v12 at most
	}
	kr, err := cl.Request(ctx, r)
	if err != nil {
		t.Fatalf("produce request: %v", err)
	}
	resp := kr.(*kmsg.ProduceResponse)
	out := map[string]int16{}
	for _, rt := range resp.Topics {
		name := rt.Topic
		if name == "" {
			name = fmt.Sprintf("%x", rt.TopicID)
		}
		for _, p := range rt.Partitions {
			out[name] = p.ErrorCode
		}
	}
	return out
}

func TestProxyTrustBoundary(t *testing.T) {
	brokers(t)
	bin := buildFerry(t)
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	storeDir := filepath.Join(t.TempDir(), "store")
	storeURL := "file://" + storeDir
	const memMax = 192 << 20
	lowLimit := "100000"
	jsonTopic := namedTopic(t, "atk-json-"+suffix, nil)
	lmA := namedTopic(t, "atk-lm-a-"+suffix, nil)
	lmB := namedTopic(t, "atk-lm-b-"+suffix, nil)
	lmSmall := namedTopic(t, "atk-lm-small-"+suffix, map[string]*string{"max.message.bytes": &lowLimit})
	canary := namedTopic(t, "atk-canary-"+suffix, nil)
	lm8 := "atk-lm-eight-" + suffix
	if resp, err := kadm.NewClient(client(t)).CreateTopic(context.Background(), 8, 1, nil, lm8); err != nil || resp.Err != nil {
		t.Fatalf("create %s: %v %v", lm8, err, resp.Err)
	}
	p := startFerryProxy(t, bin, fmt.Sprintf(`
upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
max.connections: 200
proxy.memory.max.bytes: %d
interceptor.batch.decompressed.max.bytes: %d
interceptors:
  - name: redact
    config:
      topic.pattern: "atk-json-.*"
      redact.fields: email
  - name: large-message
    config:
      topic.pattern: "atk-lm-.*|atk-canary-.*"
      large.message.payload.store.url: %s
      large.message.payload.store.retry.backoff.ms: 10
`, brokers(t), memMax, 64<<20, storeURL))
	ctx := context.Background()

	// The canary: produces and reads back through the proxy all along.
	var canaryErrs atomic.Int64
	var canaryOK atomic.Int64
	stop := make(chan struct{})
	canaryDone := make(chan struct{})
	go func() {
		defer close(canaryDone)
		cl, err := kgo.NewClient(kgo.SeedBrokers(p.bootstrap), kgo.ConsumeTopics(canary), kgo.RecordRetries(3))
		if err != nil {
			canaryErrs.Add(1)
			return
		}
		defer cl.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			v := []byte(fmt.Sprintf("canary %d", i))
			if err := cl.ProduceSync(cctx, &kgo.Record{Topic: canary, Value: v}).FirstErr(); err != nil {
				t.Logf("canary produce: %v", err)
				canaryErrs.Add(1)
			} else if fs := cl.PollRecords(cctx, 1); fs.Err0() != nil || len(fs.Records()) == 0 || !bytes.Equal(fs.Records()[0].Value, v) {
				t.Logf("canary consume: %v", fs.Err0())
				canaryErrs.Add(1)
			} else {
				canaryOK.Add(1)
			}
			cancel()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	run := func(name string, f func(t *testing.T)) {
		t.Run(name, f)
		t.Logf("after %q: proxy peak RSS %d MiB, budget in use %.0f MiB", name, p.peakRSS(t)>>20, p.metric(t, "ferry_proxy_memory_bytes")/(1<<20))
	}
	attacker := func(t *testing.T, opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(p.bootstrap), kgo.RecordRetries(2), kgo.RequestRetries(2),
			kgo.ProducerBatchMaxBytes(64 << 20), kgo.BrokerMaxWriteBytes(100 << 20)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}

	run("JSON nested 32 MiB deep", func(t *testing.T) {
		cl := attacker(t, kgo.ProducerBatchCompression(kgo.ZstdCompression()))
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: jsonTopic, Value: bytes.Repeat([]byte("["), 32<<20)}).FirstErr()
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("32 MiB of [ : %v, want INVALID_RECORD", err)
		}
	})

	run("JSON duplicate key behind an out-of-range number", func(t *testing.T) {
		cl := attacker(t)
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: jsonTopic, Value: []byte(`{"n":1e400,"email":"a","email":"secret"}`)}).FirstErr()
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("duplicate key: %v, want INVALID_RECORD", err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: jsonTopic, Value: []byte(`{"n":1e400,"email":"a"}`)}).FirstErr(); err != nil {
			t.Fatalf("a valid value with a large number: %v", err)
		}
	})

	run("forged reference to another topic's object", func(t *testing.T) {
		store, err := payloadstore.Open(ctx, storeURL, payloadstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		secret := []byte("topic B's secret payload " + suffix)
		resp, err := payloadstore.PublishBytes(ctx, store, lmB, secret)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := largemessage.PayloadReferenceValue{FullPayloadPath: resp.FullPayloadPath, PayloadStoreClass: store.Class()}.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		cl := attacker(t)
		err = cl.ProduceSync(ctx, &kgo.Record{Topic: lmA, Value: ref, Headers: []kgo.RecordHeader{
			{Key: largemessage.HeaderLargeMessage, Value: []byte("true")},
			{Key: largemessage.HeaderPayloadSize, Value: []byte(strconv.Itoa(len(secret)))}}}).FirstErr()
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("a reference into topic B produced to A: %v, want INVALID_RECORD", err)
		}
	})

	run("zstd bomb: 1 GiB in about 100 KiB", func(t *testing.T) {
		bomb := rawBatch(zstdBomb(t, 1<<30), 4, 1)
		t.Logf("bomb batch: %d bytes", len(bomb))
		cl := attacker(t)
		sets := map[string][]byte{lmA: bomb}
		if codes := rawProduce(t, cl, sets, nil); codes[lmA] != kerr.MessageTooLarge.Code {
			t.Fatalf("zstd bomb: error code %d, want MESSAGE_TOO_LARGE", codes[lmA])
		}
	})

	run("zstd bombs in 8 partitions of one request", func(t *testing.T) {
		bomb := rawBatch(zstdBomb(t, 256<<20), 4, 1)
		req := kmsg.NewPtrProduceRequest()
		req.Acks = -1
		req.TimeoutMillis = 30000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = lm8
		for p := range int32(8) {
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Partition = p
			rp.Records = bomb
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		kr, err := attacker(t).Request(ctx, &pinned{Request: req, v: 12})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range kr.(*kmsg.ProduceResponse).Topics[0].Partitions {
			if c := p.ErrorCode; c != kerr.MessageTooLarge.Code && c != kerr.RequestTimedOut.Code {
				t.Fatalf("partition %d: error code %d, want MESSAGE_TOO_LARGE or REQUEST_TIMED_OUT", p.Partition, c)
			}
		}
	})

	run("fetch amplification: 32 references to one 16 MiB object", func(t *testing.T) {
		cl := attacker(t, kgo.ProducerBatchMaxBytes(20<<20))
		big := make([]byte, 16<<20)
		_, _ = rand.Read(big)
		r := &kgo.Record{Topic: lmA, Value: big}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		raw := consumeRaw(t, lmA, 1)
		var recs []*kgo.Record
		for range 32 {
			recs = append(recs, &kgo.Record{Topic: lmA, Value: raw[0].Value, Headers: raw[0].Headers})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("32 same-topic references: %v", err)
		}
		// A consumer asking for at most 1 MiB gets one record (16 MiB: the
		// first record is always given), never 32.
		req := kmsg.NewPtrFetchRequest()
		req.MaxBytes = 1 << 20
		req.MaxWaitMillis = 100
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = lmA
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.FetchOffset = 1
		fp.PartitionMaxBytes = 1 << 20
		ft.Partitions = append(ft.Partitions, fp)
		req.Topics = append(req.Topics, ft)
		fc := attacker(t, kgo.BrokerMaxReadBytes(200<<20))
		for range 3 {
			fresp, err := req.RequestWith(ctx, fc)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, rt := range fresp.Topics {
				for _, rp := range rt.Partitions {
					n += len(rp.RecordBatches)
				}
			}
			if n > 17<<20 {
				t.Fatalf("a 1 MiB fetch got %d bytes", n)
			}
		}
	})

	run("produce v13 naming an unknown topic id", func(t *testing.T) {
		cl := attacker(t)
		var id [16]byte
		_, _ = rand.Read(id[:])
		b := rawBatch(mustRecords(t, []byte(`{"email":"in clear"}`)), 0, 1)
		codes := rawProduce(t, cl, nil, map[[16]byte][]byte{id: b})
		if c := codes[fmt.Sprintf("%x", id)]; c != kerr.UnknownTopicID.Code && c != kerr.UnknownTopicOrPartition.Code {
			t.Fatalf("unknown topic id: code %d, want UNKNOWN_TOPIC_ID", c)
		}
	})

	run("300 unknown topics in one request", func(t *testing.T) {
		before := p.metric(t, "ferry_proxy_topic_config_requests_total")
		sets := map[string][]byte{}
		for i := range 300 {
			sets[fmt.Sprintf("atk-lm-unknown-%s-%d", suffix, i)] = rawBatch(mustRecords(t, []byte("x")), 0, 1)
		}
		start := time.Now()
		rawProduce(t, attacker(t), sets, nil)
		if n := p.metric(t, "ferry_proxy_topic_config_requests_total") - before; n > 3 {
			t.Fatalf("300 topics took %v rounds of DescribeConfigs, want one or two", n)
		}
		t.Logf("300 unknown topics answered in %v", time.Since(start))
	})

	run("size prefixes without frames", func(t *testing.T) {
		before := p.metric(t, "ferry_proxy_upstream_connects_total")
		var conns []net.Conn
		for range 50 {
			c, err := net.Dial("tcp", p.bootstrap)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			_, _ = c.Write(binary.BigEndian.AppendUint32(nil, 100<<20-1))
		}
		time.Sleep(time.Second)
		if n := p.metric(t, "ferry_proxy_upstream_connects_total") - before; n > 5 {
			t.Fatalf("50 idle size prefixes opened %v upstream connections", n)
		}
		for _, c := range conns {
			c.Close()
		}
	})

	run("a batch of small records over max.message.bytes leaves no object", func(t *testing.T) {
		cl := attacker(t, kgo.ProducerLinger(time.Second), kgo.RecordRetries(4), kgo.ProducerBatchMaxBytes(2<<20))
		var recs []*kgo.Record
		for i := range 20000 {
			recs = append(recs, &kgo.Record{Topic: lmSmall, Value: []byte(fmt.Sprintf("record %05d padded to fifty bytes................", i))})
		}
		err := cl.ProduceSync(ctx, recs...).FirstErr()
		if !errors.Is(err, kerr.MessageTooLarge) {
			t.Fatalf("20,000 small records over the topic's limit: %v, want MESSAGE_TOO_LARGE", err)
		}
		if n := countFiles(t, filepath.Join(storeDir, lmSmall)); n != 0 {
			t.Fatalf("the refused batch left %d objects in the store", n)
		}
	})

	close(stop)
	<-canaryDone
	if canaryErrs.Load() != 0 || canaryOK.Load() == 0 {
		t.Fatalf("the canary client failed %d times (%d round trips succeeded)", canaryErrs.Load(), canaryOK.Load())
	}
	rss := p.peakRSS(t)
	bound := int64(memMax + 128<<20 + 200*(100<<10)) // docs/SECURITY.md, with max.connections 200
	t.Logf("proxy peak RSS %d MiB (bound %d MiB); canary round trips %d", rss>>20, bound>>20, canaryOK.Load())
	if rss > bound {
		t.Fatalf("proxy peak RSS %d MiB over the bound %d MiB", rss>>20, bound>>20)
	}
}

// mustRecords is an uncompressed records section of one record.
func mustRecords(t *testing.T, value []byte) []byte {
	t.Helper()
	r := kmsg.Record{Value: value, Headers: []kmsg.Header{}}
	body := r.AppendTo(nil)[1:] // without the zero length
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}
