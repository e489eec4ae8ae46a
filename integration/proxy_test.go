package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrykit/ferry/proxy"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// startProxy starts an in-process ferry proxy in front of upstream (one or
// more host:port, comma-separated) on free 127.0.0.1 ports and returns its
// bootstrap address; the proxy is shut down at the test's cleanup. Broker
// listeners get free ports too (listen port 0).
func startProxy(t testing.TB, upstream string) (bootstrap string) {
	t.Helper()
	s := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(upstream)})
	return s.Addr()
}

// startProxyServer is startProxy with a Config (Listen defaults to
// 127.0.0.1:0) that returns the Server.
func startProxyServer(t testing.TB, cfg proxy.Config) *proxy.Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	s, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("proxy shutdown: %v", err)
		}
	})
	return s
}

// testLogWriter sends the proxy's logs to t.Log (shown with -v or on
// failure); lines after the test ended are dropped.
type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // Log after the test completed panics
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// realPorts returns the broker's real ports (of FERRY_KAFKA_BROKERS).
func realPorts(t testing.TB) []int {
	var ports []int
	for _, b := range strings.Split(brokers(t), ",") {
		_, p, err := net.SplitHostPort(b)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(p)
		ports = append(ports, n)
	}
	return ports
}

// portScanner records every byte a client receives and reports whether one
// of the real broker ports shows up, as text ("41115") or as a big-endian
// int32 (how Metadata and friends encode a port).
type portScanner struct {
	mu   sync.Mutex
	seen bytes.Buffer
}

func (s *portScanner) dialer(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &scanConn{Conn: c, s: s}, nil
}

type scanConn struct {
	net.Conn
	s *portScanner
}

func (c *scanConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.s.mu.Lock()
	c.s.seen.Write(p[:n])
	c.s.mu.Unlock()
	return n, err
}

// check fails the test if a real broker address (host:port) occurs in what
// clients received, in either form it could take: as text ("127.0.0.1:41115",
// as in a config value) or as Kafka encodes a broker endpoint (the host
// string's bytes directly followed by the port as a big-endian int32). It
// returns the number of bytes scanned.
func (s *portScanner) check(t testing.TB, addrs []string) int {
	t.Helper()
	for _, leak := range s.leaks(t, addrs) {
		t.Errorf("a response seen by the client contains the real broker %s", leak)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen.Len()
}

// leaks lists the forms of addrs found in what clients received.
func (s *portScanner) leaks(t testing.TB, addrs []string) []string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.seen.Bytes()
	var out []string
	for _, a := range addrs {
		host, p, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if bytes.Contains(b, []byte(a)) {
			out = append(out, "address "+a+" as text")
		}
		if bytes.Contains(b, binary.BigEndian.AppendUint32([]byte(host), uint32(port))) {
			out = append(out, "endpoint "+a+" (host string, int32 port)")
		}
	}
	return out
}

// realAddrs returns the real broker addresses (FERRY_KAFKA_BROKERS).
func realAddrs(t testing.TB) []string { return strings.Split(brokers(t), ",") }

// proxyClient is a franz-go client whose only seed is the proxy; every byte
// it receives goes through scan.
func proxyClient(t testing.TB, bootstrap string, scan *portScanner, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	base := []kgo.Opt{kgo.SeedBrokers(bootstrap)}
	if scan != nil {
		base = append(base, kgo.Dialer(scan.dialer))
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produceConsume produces n 1 KiB-ish records to a new topic through cl and
// reads them back through a second client of the proxy.
func produceConsume(t *testing.T, bootstrap string, scan *portScanner, n int, prodOpts ...kgo.Opt) {
	t.Helper()
	produceConsumeWith(t, bootstrap, scan, n, nil, prodOpts...)
}

// produceConsumeWith is produceConsume with options for every client
// (e.g. TLS).
func produceConsumeWith(t *testing.T, bootstrap string, scan *portScanner, n int, common []kgo.Opt, prodOpts ...kgo.Opt) {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	topic := createTopicVia(t, bootstrap, scan, common...)
	prod := proxyClient(t, bootstrap, scan, append(append([]kgo.Opt{kgo.DefaultProduceTopic(topic)}, common...), prodOpts...)...)
	var want [][]byte
	for i := range n {
		v := randomBytes(uint64(i), 1024)
		want = append(want, v)
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: v}).FirstErr(); err != nil {
			t.Fatalf("produce %d through the proxy: %v", i, err)
		}
	}
	cons := proxyClient(t, bootstrap, scan, append([]kgo.Opt{kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, common...)...)
	var got [][]byte
	for len(got) < n {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", len(got), n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		for _, r := range fs.Records() {
			got = append(got, r.Value)
		}
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d differs after the round trip", i)
		}
	}
}

// createTopicVia creates a topic through the proxy with kadm.
func createTopicVia(t testing.TB, bootstrap string, scan *portScanner, opts ...kgo.Opt) string {
	t.Helper()
	adm := kadm.NewClient(proxyClient(t, bootstrap, scan, opts...))
	name := fmt.Sprintf("ferry-proxy-%s-%d-%d", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")),
		time.Now().UnixNano()%1e6, topicSeq.Add(1))
	resp, err := adm.CreateTopic(ctxT(t, 30*time.Second), 1, 1, nil, name)
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic %s through the proxy: %v %v", name, err, resp.Err)
	}
	return name
}

func TestProxyProduceConsumeCodecs(t *testing.T) {
	bootstrap := startProxy(t, brokers(t))
	scan := &portScanner{}
	for _, codec := range []struct {
		name string
		c    kgo.CompressionCodec
	}{
		{"none", kgo.NoCompression()}, {"gzip", kgo.GzipCompression()}, {"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()}, {"zstd", kgo.ZstdCompression()},
	} {
		t.Run(codec.name, func(t *testing.T) {
			produceConsume(t, bootstrap, scan, 50, kgo.ProducerBatchCompression(codec.c))
		})
	}
	if n := scan.check(t, realAddrs(t)); n == 0 {
		t.Fatal("the scanner saw no bytes")
	}
}

// The proxy's listeners answer Metadata, FindCoordinator (single and
// batched) and DescribeCluster with its own addresses.
func TestProxyRewritesAddresses(t *testing.T) {
	s := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t))})
	scan := &portScanner{}
	cl := proxyClient(t, s.Addr(), scan)
	ctx := ctxT(t, time.Minute)
	real := realPorts(t)
	isReal := func(port int32) bool {
		for _, p := range real {
			if int(port) == p {
				return true
			}
		}
		return false
	}

	meta := kmsg.NewPtrMetadataRequest()
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(mresp.Brokers) == 0 {
		t.Fatal("Metadata through the proxy named no broker")
	}
	for _, b := range mresp.Brokers {
		addr, ok := s.BrokerAddr(b.NodeID)
		if !ok || addr != net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))) || isReal(b.Port) {
			t.Fatalf("Metadata broker %d = %s:%d, want the proxy's %s", b.NodeID, b.Host, b.Port, addr)
		}
	}

	for _, v := range []int16{3, 4} { // single, batched
		fc := kmsg.NewPtrFindCoordinatorRequest()
		fc.CoordinatorKey = "ferry-proxy-group"
		fc.CoordinatorKeys = []string{"ferry-proxy-group", "ferry-proxy-group-2"}
		br := cl.Broker(int(mresp.Brokers[0].NodeID))
		// Pin the version: kgo would otherwise pick the highest. The
		// offsets topic may still be on its way: retry while the
		// coordinator is not available (15).
		var resp *kmsg.FindCoordinatorResponse
		for {
			raw, err := br.Request(ctx, &pinned{Request: fc, v: v})
			if err != nil {
				t.Fatalf("FindCoordinator v%d: %v", v, err)
			}
			resp = raw.(*kmsg.FindCoordinatorResponse)
			pending := resp.ErrorCode == 15
			for _, c := range resp.Coordinators {
				pending = pending || c.ErrorCode == 15
			}
			if !pending || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		var ports []int32
		if v <= 3 {
			if resp.ErrorCode != 0 {
				t.Fatalf("FindCoordinator v3 error %d", resp.ErrorCode)
			}
			ports = append(ports, resp.Port)
		}
		for _, c := range resp.Coordinators {
			if c.ErrorCode != 0 {
				t.Fatalf("FindCoordinator v4 %s error %d", c.Key, c.ErrorCode)
			}
			ports = append(ports, c.Port)
		}
		if len(ports) == 0 {
			t.Fatalf("FindCoordinator v%d named no coordinator", v)
		}
		for _, p := range ports {
			if isReal(p) || p <= 0 {
				t.Fatalf("FindCoordinator v%d coordinator port %d", v, p)
			}
		}
	}

	dc := kmsg.NewPtrDescribeClusterRequest()
	dresp, err := dc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(dresp.Brokers) == 0 {
		t.Fatal("DescribeCluster named no broker")
	}
	for _, b := range dresp.Brokers {
		if isReal(b.Port) {
			t.Fatalf("DescribeCluster broker %d has the real port %d", b.NodeID, b.Port)
		}
	}
	// Found by review: a broker's configs name its real listeners.
	for _, b := range mresp.Brokers {
		dcr := kmsg.NewPtrDescribeConfigsRequest()
		res := kmsg.NewDescribeConfigsRequestResource()
		res.ResourceType = kmsg.ConfigResourceTypeBroker
		res.ResourceName = strconv.Itoa(int(b.NodeID))
		dcr.Resources = append(dcr.Resources, res)
		dcr.IncludeSynonyms = true
		cresp, err := dcr.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		masked := false
		for _, r := range cresp.Resources {
			for _, c := range r.Configs {
				if c.Name == "listeners" || c.Name == "advertised.listeners" {
					if c.Value != nil {
						t.Fatalf("DescribeConfigs broker %d: %s = %q, want it masked", b.NodeID, c.Name, *c.Value)
					}
					masked = masked || c.IsSensitive
				}
			}
		}
		if !masked {
			t.Fatalf("DescribeConfigs broker %d returned no masked listeners config", b.NodeID)
		}
	}
	dq := kmsg.NewPtrDescribeQuorumRequest()
	dqt := kmsg.NewDescribeQuorumRequestTopic()
	dqt.Topic = "__cluster_metadata"
	dqt.Partitions = []kmsg.DescribeQuorumRequestTopicPartition{kmsg.NewDescribeQuorumRequestTopicPartition()}
	dq.Topics = append(dq.Topics, dqt)
	if _, err := dq.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	scan.check(t, realAddrs(t))

	// Control: the same scan of a client talking to the broker directly
	// finds the real endpoint, so a clean scan above means something.
	direct := &portScanner{}
	dcl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers(t), ",")...), kgo.Dialer(direct.dialer))
	if err != nil {
		t.Fatal(err)
	}
	defer dcl.Close()
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, dcl); err != nil {
		t.Fatal(err)
	}
	if len(direct.leaks(t, realAddrs(t))) == 0 {
		t.Fatal("the scanner did not find the real endpoint in a direct Metadata response")
	}
}

// pinned sends a request at a fixed version through kgo.
type pinned struct {
	kmsg.Request
	v int16
}

func (p *pinned) MaxVersion() int16 { return p.v }

// ApiVersions through the proxy is the broker's answer narrowed to kmsg's
// versions.
func TestProxyApiVersionsIntersection(t *testing.T) {
	bootstrap := startProxy(t, brokers(t))
	ctx := ctxT(t, time.Minute)
	direct, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, client(t))
	if err != nil {
		t.Fatal(err)
	}
	via, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, proxyClient(t, bootstrap, nil))
	if err != nil {
		t.Fatal(err)
	}
	got := map[int16]kmsg.ApiVersionsResponseApiKey{}
	for _, k := range via.ApiKeys {
		got[k.ApiKey] = k
	}
	kept := 0
	for _, k := range direct.ApiKeys {
		maxV, known := proxy.CodecMaxVersion(k.ApiKey)
		g, ok := got[k.ApiKey]
		switch {
		case !known && ok:
			t.Errorf("key %d unknown to kmsg is offered", k.ApiKey)
		case known && k.MinVersion <= maxV && !ok:
			t.Errorf("key %d (%s) dropped", k.ApiKey, kmsg.NameForKey(k.ApiKey))
		case ok:
			kept++
			if g.MinVersion != k.MinVersion || g.MaxVersion != min(k.MaxVersion, maxV) {
				t.Errorf("key %d: [%d,%d], want [%d,%d]", k.ApiKey, g.MinVersion, g.MaxVersion, k.MinVersion, min(k.MaxVersion, maxV))
			}
		}
	}
	if kept < 20 {
		t.Fatalf("only %d keys kept", kept)
	}
}

// rawRoundTrip writes frame to addr and returns the response frame (nil if
// the proxy closed the connection without one).
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

func readRawFrame(c net.Conn) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err := io.ReadFull(c, msg)
	return msg, err
}

// A client ApiVersions request in a version the proxy does not know gets
// the v0 UNSUPPORTED_VERSION answer with the proxy's range (KIP-511), and the
// connection stays usable.
func TestProxyApiVersionsUnknownVersion(t *testing.T) {
	bootstrap := startProxy(t, brokers(t))
	c := rawConn(t, bootstrap)
	maxV, _ := proxy.CodecMaxVersion(18)
	// Header v2 (ApiVersions v3+ is flexible), an empty v3-style body.
	frame := []byte{0, 0, 0, 0, 0, 18, 0, byte(maxV + 1), 0, 0, 0, 9, 0xff, 0xff, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	msg, err := readRawFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	if corr := int32(binary.BigEndian.Uint32(msg)); corr != 9 {
		t.Fatalf("correlation id %d, want 9", corr)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	if err := resp.ReadFrom(msg[4:]); err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != 35 || len(resp.ApiKeys) != 1 || resp.ApiKeys[0].MaxVersion != maxV {
		t.Fatalf("answer = %+v, want UNSUPPORTED_VERSION with ApiVersions [0,%d]", resp, maxV)
	}
	// Retry at v0 on the same connection, as clients do.
	frame = []byte{0, 0, 0, 0, 0, 18, 0, 0, 0, 0, 0, 10, 0xff, 0xff}
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	msg, err = readRawFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	resp = kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	if err := resp.ReadFrom(msg[4:]); err != nil || resp.ErrorCode != 0 || len(resp.ApiKeys) < 20 {
		t.Fatalf("v0 retry: %+v, %v", resp, err)
	}
}

// Bad frames close only their own connection; the proxy keeps serving.
func TestProxyBadFramesCloseOnlyThatConnection(t *testing.T) {
	s := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)), AdminListen: "127.0.0.1:0",
		MaxRequestBytes: 1 << 20})
	good := proxyClient(t, s.Addr(), nil)
	ctx := ctxT(t, time.Minute)
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, good); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"size prefix over socket.request.max.bytes": {0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0},
		"negative size prefix":                      {0xff, 0xff, 0xff, 0xff},
		"unknown API key":                           {0, 0, 0, 10, 0x7f, 0x00, 0, 0, 0, 0, 0, 1, 0xff, 0xff},
		"truncated header":                          {0, 0, 0, 3, 0, 3, 0},
		"Metadata version above kmsg's":             {0, 0, 0, 10, 0, 3, 0x7f, 0, 0, 0, 0, 1, 0xff, 0xff},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			c := rawConn(t, s.Addr())
			if _, err := c.Write(in); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			if n, err := c.Read(b[:]); err == nil {
				t.Fatalf("read %d bytes, want the connection closed", n)
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("connection still open after 30s")
			}
		})
	}
	// A client that disconnects mid-request.
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte{0, 0, 1, 0, 0, 3, 0, 4})
	c.Close()

	// The proxy still serves the first client, and counted the errors.
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, good); err != nil {
		t.Fatalf("after the bad connections: %v", err)
	}
	body := httpGet(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{`ferry_proxy_errors_total{kind="frame_too_large"} 2`, `ferry_proxy_errors_total{kind="unknown_key"} 1`,
		`ferry_proxy_requests_total{api="Metadata"}`, "ferry_proxy_request_duration_seconds_bucket"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if h := httpGet(t, "http://"+s.AdminAddr()+"/healthz"); h != "ok\n" {
		t.Errorf("/healthz = %q", h)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// acks=0 produce: no response is expected, so the proxy must not wait for
// one (a request pipelined behind it still gets its answer).
func TestProxyAcksZero(t *testing.T) {
	bootstrap := startProxy(t, brokers(t))
	topic := createTopicVia(t, bootstrap, nil)
	ctx := ctxT(t, time.Minute)
	prod := proxyClient(t, bootstrap, nil, kgo.DefaultProduceTopic(topic), kgo.RequiredAcks(kgo.NoAck()),
		kgo.DisableIdempotentWrite())
	for i := range 100 {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cons := proxyClient(t, bootstrap, nil, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	n := 0
	for n < 100 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of 100 acks=0 records: %v", n, ctx.Err())
		}
		n += len(fs.Records())
	}
	// The producer's connection is still answered (Metadata after acks=0).
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, prod); err != nil {
		t.Fatal(err)
	}
}

// Pipelined requests (several written before any response is read) are
// answered in order with the clients' correlation ids, the rewritten
// Metadata among them.
func TestProxyPipelinedInOrder(t *testing.T) {
	bootstrap := startProxy(t, brokers(t))
	c := rawConn(t, bootstrap)
	id := "pipeline"
	var batch []byte
	type sent struct {
		corr int32
		key  int16
		ver  int16
	}
	var order []sent
	for i := range 12 {
		var req kmsg.Request
		switch i % 3 {
		case 0:
			r := kmsg.NewPtrApiVersionsRequest()
			r.Version = 0
			req = r
		case 1:
			r := kmsg.NewPtrMetadataRequest()
			r.Version = 12
			req = r
		case 2:
			r := kmsg.NewPtrMetadataRequest()
			r.Version = 4
			req = r
		}
		corr := int32(1000 + 7*i)
		frame := binary.BigEndian.AppendUint32(nil, 0)
		frame = binary.BigEndian.AppendUint16(frame, uint16(req.Key()))
		frame = binary.BigEndian.AppendUint16(frame, uint16(req.GetVersion()))
		frame = binary.BigEndian.AppendUint32(frame, uint32(corr))
		frame = binary.BigEndian.AppendUint16(frame, uint16(len(id)))
		frame = append(frame, id...)
		if req.IsFlexible() {
			frame = append(frame, 0)
		}
		frame = req.AppendTo(frame)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
		batch = append(batch, frame...)
		order = append(order, sent{corr, req.Key(), req.GetVersion()})
	}
	if _, err := c.Write(batch); err != nil { // all twelve in one write
		t.Fatal(err)
	}
	real := realAddrs(t)
	for _, want := range order {
		msg, err := readRawFrame(c)
		if err != nil {
			t.Fatalf("response to correlation id %d: %v", want.corr, err)
		}
		if corr := int32(binary.BigEndian.Uint32(msg)); corr != want.corr {
			t.Fatalf("correlation id %d, want %d: out of order", corr, want.corr)
		}
		if want.key != 3 {
			continue
		}
		hlen := 4
		if want.ver >= 9 {
			hlen = 5 // flexible response header: one empty tagged-field byte
		}
		resp := kmsg.NewPtrMetadataResponse()
		resp.Version = want.ver
		if err := resp.ReadFrom(msg[hlen:]); err != nil {
			t.Fatalf("Metadata v%d response does not decode: %v", want.ver, err)
		}
		if len(resp.Brokers) == 0 {
			t.Fatalf("Metadata v%d named no broker", want.ver)
		}
		for _, b := range resp.Brokers {
			for _, a := range real {
				if net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))) == a {
					t.Fatalf("Metadata v%d names the real broker %s", want.ver, a)
				}
			}
		}
	}
}

// Found by review: a client that sends its last request and half-closes
// its side still gets the answer, as from the broker.
func TestProxyHalfCloseGetsLastResponse(t *testing.T) {
	s := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t))})
	for i := range 20 {
		c, err := net.DialTimeout("tcp", s.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		req := kmsg.NewPtrMetadataRequest()
		req.Version = 1
		clientID := "half-close"
		frame := make([]byte, 4, 64)
		frame = kbin.AppendInt16(frame, req.Key())
		frame = kbin.AppendInt16(frame, req.Version)
		frame = kbin.AppendInt32(frame, int32(100+i))
		frame = kbin.AppendNullableString(frame, &clientID)
		frame = req.AppendTo(frame)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
		if _, err := c.Write(frame); err != nil {
			t.Fatal(err)
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var size [4]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			t.Fatalf("try %d: no response after a half-close: %v", i, err)
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatalf("try %d: truncated response: %v", i, err)
		}
		if corr := int32(binary.BigEndian.Uint32(body)); corr != int32(100+i) {
			t.Fatalf("try %d: correlation id %d, want %d", i, corr, 100+i)
		}
		c.Close()
	}
}
