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
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
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

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kbin"
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
	cmd := exec.Command(bin, "proxy", "--config", cfgFile, "--log-level", cmp.Or(os.Getenv("FERRY_TEST_PROXY_LOG_LEVEL"), "warn"))
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
		if f := os.Getenv("FERRY_TEST_PROXY_LOG"); f != "" { // all of it, for debugging
			_ = os.WriteFile(f, []byte(p.stderr.String()), 0o644)
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
max.connections.per.ip: 200
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
				got := "no record"
				if rs := fs.Records(); len(rs) > 0 {
					got = fmt.Sprintf("%q at offset %d", rs[0].Value, rs[0].Offset)
				}
				t.Logf("canary consume: %v: got %s, want %q", fs.Err0(), got, v)
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
		// Each partition ends within its time budget; on a loaded 2-core
		// machine all eight together took over franz-go's default wait.
		kr, err := attacker(t, kgo.RequestTimeoutOverhead(60*time.Second)).Request(ctx, &pinned{Request: req, v: 12})
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

	// From the break review: requests whose decoded form is many times
	// their bytes (2-byte topics, 2-byte headers), every codec's bomb, a
	// KIP-only reference to a large object, large fetches at once, stalled
	// frames, made-up topic ids, lying headers, clients gone mid-produce,
	// a topic that recompresses.
	run("Fetch and Produce requests of a million empty topics", func(t *testing.T) {
		for _, key := range []int16{1, 0} {
			c := rawConn(t, p.bootstrap)
			if _, err := c.Write(manyTopics(key, 1_500_000)); err != nil {
				t.Fatal(err)
			}
			_, _ = readRawFrame(c) // an answer or the connection closed: either is fine
		}
	})

	// Break review 2: a million tiny corrupt partitions of an intercepted
	// topic in 9 MB (each answered, each answer uncharged: 736 MB of RSS),
	// and a partition array of length -2^31 that cancelled the count.
	run("a Produce of a million corrupt partitions of an intercepted topic", func(t *testing.T) {
		c := rawConn(t, p.bootstrap)
		if _, err := c.Write(manyPartitions(lmA, 1_000_000)); err != nil {
			t.Fatal(err)
		}
		_, _ = readRawFrame(c) // an answer or the connection closed: either is fine
	})

	run("30 million headers in 600 KB of zstd", func(t *testing.T) {
		bomb := rawBatch(headerBomb(t, 30_000_000), 4, 1)
		t.Logf("header bomb batch: %d bytes", len(bomb))
		codes := rawProduce(t, attacker(t), map[string][]byte{lmA: bomb}, nil)
		if c := codes[lmA]; c == 0 {
			t.Fatal("30 million headers were accepted")
		}
	})

	run("bombs of every codec", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			codec int16
			recs  []byte
		}{
			{"gzip", 1, gzipBomb(t, 200<<20)},
			{"snappy", 2, snappyBomb(t, false)},
			{"snappy (xerial)", 2, snappyBomb(t, true)},
			{"lz4", 3, lz4Bomb(t, 200<<20)},
		} {
			b := rawBatch(tc.recs, tc.codec, 1)
			if c := rawProduce(t, attacker(t), map[string][]byte{lmA: b}, nil)[lmA]; c != kerr.MessageTooLarge.Code && c != kerr.RequestTimedOut.Code {
				t.Fatalf("%s bomb (%d bytes): error code %d", tc.name, len(b), c)
			}
		}
	})

	big := make([]byte, 40<<20)
	_, _ = rand.Read(big)
	var bigRec *kgo.Record // as stored: a reference
	run("references without size headers to a 40 MiB object", func(t *testing.T) {
		cl := attacker(t, kgo.ProducerBatchMaxBytes(48<<20))
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: lmB, Value: big}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		bigRec = consumeRaw(t, lmB, 1)[0]
		// Written straight to the broker (not through the proxy, which
		// would add the headers), twelve times, without Ferry's headers.
		var recs []*kgo.Record
		for range 12 {
			recs = append(recs, &kgo.Record{Topic: lmB, Value: bigRec.Value,
				Headers: []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")}}})
		}
		if err := client(t).ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		fetchAll(t, attacker(t, kgo.BrokerMaxReadBytes(1<<30)), lmB, 1, 2_000_000_000)
	})

	run("four 40 MiB fetches at once", func(t *testing.T) {
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fetchAll(t, attacker(t, kgo.BrokerMaxReadBytes(1<<30)), lmB, 0, 200<<20)
			}()
		}
		wg.Wait()
	})

	run("stalled frames hold no one else back", func(t *testing.T) {
		for range 3 {
			c := rawConn(t, p.bootstrap)
			// The start of a 60 MiB Produce request (v9: header, a null
			// transactional id, acks 1, one topic "x" of one partition
			// whose records field takes the rest), then nothing.
			frame := make([]byte, 30<<20)
			binary.BigEndian.PutUint32(frame, 60<<20)
			head := []byte{0, 0, 0, 9, 0, 0, 0, 1, 0, 1, 'x', 0, // header v2
				0, 0, 1, 0, 0, 0x75, 0x30, 2, 2, 'x', 2, 0, 0, 0, 0} // body up to the records field
			const uvLen, trailingTags = 4, 3
			head = kbin.AppendUvarint(head, uint32(60<<20-len(head)-uvLen-trailingTags)+1)
			copy(frame[4:], head)
			// The proxy may stop reading a frame the budget has no room
			// for yet (it waits): a write that times out is fine.
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(frame); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
		}
		// A new client still gets through (and the canary all along).
		cl := attacker(t)
		if err := cl.ProduceSync(ctxT(t, 20*time.Second), &kgo.Record{Topic: lmA, Value: []byte("beside stalled frames")}).FirstErr(); err != nil {
			t.Fatalf("a client beside three stalled 60 MiB frames: %v", err)
		}
	})

	run("Produce v13 with 3000 made-up topic ids", func(t *testing.T) {
		before := p.metric(t, "ferry_proxy_topic_id_lookups_total")
		ids := map[[16]byte][]byte{}
		for range 3000 {
			var id [16]byte
			_, _ = rand.Read(id[:])
			ids[id] = rawBatch(mustRecords(t, []byte("x")), 0, 1)
		}
		rawProduce(t, attacker(t), nil, ids)
		if n := p.metric(t, "ferry_proxy_topic_id_lookups_total") - before; n > 2 {
			t.Fatalf("3000 made-up ids cost %v Metadata requests", n)
		}
	})

	run("a reference whose headers lie is stored with the object's", func(t *testing.T) {
		if bigRec == nil {
			t.Skip("needs the 40 MiB object")
		}
		hs := []kgo.RecordHeader{{Key: largemessage.HeaderLargeMessage, Value: []byte("true")},
			{Key: largemessage.HeaderPayloadSize, Value: []byte("2097152")},
			{Key: largemessage.HeaderPayloadSHA256, Value: []byte(strings.Repeat("ab", 32))}}
		if err := attacker(t).ProduceSync(ctx, &kgo.Record{Topic: lmB, Value: bigRec.Value, Headers: hs}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		raw := consumeRaw(t, lmB, 14) // one through the proxy, twelve straight, this one
		last := raw[len(raw)-1]
		for _, h := range last.Headers {
			if h.Key == largemessage.HeaderPayloadSize && string(h.Value) != strconv.Itoa(len(big)) {
				t.Fatalf("stored size header %s, the object has %d bytes", h.Value, len(big))
			}
		}
	})

	run("clients gone mid-produce leave no unreferenced object", func(t *testing.T) {
		topic := namedTopic(t, "atk-lm-gone-"+suffix, nil)
		for i := range 20 {
			c := rawConn(t, p.bootstrap)
			req := kmsg.NewPtrProduceRequest()
			req.Version, req.Acks, req.TimeoutMillis = 9, -1, 10000
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = topic
			rp := kmsg.NewProduceRequestTopicPartition()
			var recs []byte
			for j := range 3 {
				recs = append(recs, rawRecordAt(bytes.Repeat([]byte{byte(i), byte(j)}, 1<<20+j), int32(j))...)
			}
			rp.Records = rawBatch(recs, 0, 3)
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			if _, err := c.Write(requestFrameOf(req, 1)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(i*15) * time.Millisecond)
			c.Close()
		}
		time.Sleep(3 * time.Second) // abandoned work ends and is undone
		referenced := map[string]bool{}
		for _, r := range consumeAll(t, topic) {
			if largemessage.IsOffloaded(r) {
				ref, err := largemessage.DecodeReference(r.Value)
				if err != nil {
					t.Fatal(err)
				}
				referenced[filepath.Base(ref.FullPayloadPath)] = true
			}
		}
		n := 0
		_ = filepath.Walk(filepath.Join(storeDir, topic), func(path string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() && !strings.HasPrefix(info.Name(), ".") {
				n++
				if !referenced[info.Name()] {
					t.Errorf("object %s is referenced by no record", info.Name())
				}
			}
			return nil
		})
		t.Logf("%d objects, %d referenced", n, len(referenced))
	})

	run("a topic whose compression.type makes the broker recompress", func(t *testing.T) {
		gz := "gzip"
		topic := namedTopic(t, "atk-lm-gz-"+suffix, map[string]*string{"compression.type": &gz})
		v := make([]byte, 1_048_400)
		_, _ = rand.Read(v)
		if err := attacker(t, kgo.ProducerBatchCompression(kgo.NoCompression())).ProduceSync(ctx, &kgo.Record{Topic: topic, Value: v}).FirstErr(); err != nil {
			t.Fatalf("1,048,400 random bytes to a gzip topic through the proxy: %v", err)
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
	return rawRecordAt(value, 0)
}

// rawRecordAt is one uncompressed record of value at offset delta d in its
// batch.
func rawRecordAt(value []byte, d int32) []byte {
	r := kmsg.Record{OffsetDelta: d, Value: value, Headers: []kmsg.Header{}}
	body := r.AppendTo(nil)[1:] // without the zero length
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// manyTopics is a whole request frame (key 1: Fetch v12, 0: Produce v9)
// naming n topics of one letter with no partitions: 4 bytes a topic.
func manyTopics(key int16, n int) []byte {
	b := make([]byte, 4, 64+4*n)
	b = binary.BigEndian.AppendUint16(b, uint16(key))
	v := uint16(12)
	if key == 0 {
		v = 9
	}
	b = binary.BigEndian.AppendUint16(b, v)
	b = binary.BigEndian.AppendUint32(b, 1) // correlation id
	b = binary.BigEndian.AppendUint16(b, 1) // client id
	b = append(b, 'a', 0)                   // client id, header tags
	if key == 1 {
		b = binary.BigEndian.AppendUint32(b, 0xffffffff) // replica id
		b = binary.BigEndian.AppendUint32(b, 100)        // max wait
		b = binary.BigEndian.AppendUint32(b, 1)          // min bytes
		b = binary.BigEndian.AppendUint32(b, 1<<20)      // max bytes
		b = append(b, 0)                                 // isolation
		b = binary.BigEndian.AppendUint32(b, 0)          // session id
		b = binary.BigEndian.AppendUint32(b, 0xffffffff) // session epoch
	} else {
		b = append(b, 0)                         // transactional id: null
		b = binary.BigEndian.AppendUint16(b, 1)  // acks
		b = binary.BigEndian.AppendUint32(b, 10) // timeout
	}
	b = binary.AppendUvarint(b, uint64(n)+1)
	for range n {
		b = append(b, 2, 'x', 1, 0) // name "x", no partitions, no tags
	}
	if key == 1 {
		b = append(b, 1, 1) // no forgotten topics, rack ""
	}
	b = append(b, 0) // tags
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// manyPartitions is a Produce v9 request frame of topic with n partitions,
// each a 3-byte record set that is no batch.
func manyPartitions(topic string, n int) []byte {
	b := make([]byte, 4, 64+len(topic)+9*n)
	b = binary.BigEndian.AppendUint16(b, 0) // Produce
	b = binary.BigEndian.AppendUint16(b, 9)
	b = binary.BigEndian.AppendUint32(b, 1) // correlation id
	b = binary.BigEndian.AppendUint16(b, 1) // client id
	b = append(b, 'a', 0)                   // client id, header tags
	b = append(b, 0)                        // transactional id: null
	b = binary.BigEndian.AppendUint16(b, 1) // acks
	b = binary.BigEndian.AppendUint32(b, 1000)
	b = append(b, 2) // one topic
	b = binary.AppendUvarint(b, uint64(len(topic))+1)
	b = append(b, topic...)
	b = binary.AppendUvarint(b, uint64(n)+1)
	for i := range n {
		b = binary.BigEndian.AppendUint32(b, uint32(i))
		b = append(b, 4, 1, 2, 3, 0) // records: 3 bytes; no tags
	}
	b = append(b, 0, 0) // topic tags, request tags
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// headerBomb is a records section of one record with n headers of an empty
// key and a null value (2 bytes each), zstd-compressed.
func headerBomb(t *testing.T, n int) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	body := 1 + 1 + 1 + 1 + 1 + varintLen(int64(n)) + 2*n
	var rec []byte
	rec = binary.AppendVarint(rec, int64(body))
	rec = append(rec, 0, 0, 0)
	rec = binary.AppendVarint(rec, -1) // key
	rec = binary.AppendVarint(rec, -1) // value
	rec = binary.AppendVarint(rec, int64(n))
	if _, err := enc.Write(rec); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0, 1}, 1<<19)
	for left := 2 * n; left > 0; left -= len(chunk) {
		if _, err := enc.Write(chunk[:min(len(chunk), left)]); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// zeroRecord is the start of a records section of one record whose value
// is n zero bytes: everything but the value and its trailing header count.
func zeroRecord(n int64) []byte {
	body := 1 + 1 + 1 + 1 + varintLen(n) + int(n) + 1
	var rec []byte
	rec = binary.AppendVarint(rec, int64(body))
	rec = append(rec, 0, 0, 0)
	rec = binary.AppendVarint(rec, -1)
	return binary.AppendVarint(rec, n)
}

// streamBomb writes a record of n zero bytes through w.
func streamBomb(t *testing.T, w io.WriteCloser, n int64) {
	t.Helper()
	if _, err := w.Write(zeroRecord(n)); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(zero)) {
		if _, err := w.Write(zero[:min(int64(len(zero)), left)]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func gzipBomb(t *testing.T, n int64) []byte {
	var out bytes.Buffer
	w, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	streamBomb(t, w, n)
	return out.Bytes()
}

func lz4Bomb(t *testing.T, n int64) []byte {
	var out bytes.Buffer
	streamBomb(t, lz4.NewWriter(&out), n)
	return out.Bytes()
}

// snappyBomb is a record of 99 MiB of zeros as one raw snappy block, or in
// xerial framing (32 KiB blocks), as the Java client writes it.
func snappyBomb(t *testing.T, xerial bool) []byte {
	t.Helper()
	n := int64(99 << 20)
	raw := append(zeroRecord(n), make([]byte, n+1)...)
	if !xerial {
		return s2.EncodeSnappy(nil, raw)
	}
	out := []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1}
	for len(raw) > 0 {
		blk := s2.EncodeSnappy(nil, raw[:min(len(raw), 32<<10)])
		raw = raw[min(len(raw), 32<<10):]
		out = binary.BigEndian.AppendUint32(out, uint32(len(blk)))
		out = append(out, blk...)
	}
	return out
}

// fetchAll fetches topic's partition 0 from offset with max bytes through
// cl, once: an answer (records or an error code) is what counts; the
// proxy's memory is the test's to check.
func fetchAll(t *testing.T, cl *kgo.Client, topic string, offset int64, maxBytes int32) {
	t.Helper()
	req := kmsg.NewPtrFetchRequest()
	req.MaxBytes, req.MaxWaitMillis = maxBytes, 100
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = topic
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.FetchOffset, fp.PartitionMaxBytes = offset, maxBytes
	ft.Partitions = append(ft.Partitions, fp)
	req.Topics = append(req.Topics, ft)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cl.Request(ctx, &pinned{Request: req, v: 12}); err != nil {
		t.Logf("fetch: %v", err)
	}
}

// consumeAll reads every record of topic from the start (until 5 s pass
// without one).
func consumeAll(t *testing.T, topic string) []*kgo.Record {
	t.Helper()
	cl := client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		if len(fs.Records()) == 0 {
			return out
		}
		out = append(out, fs.Records()...)
	}
}
