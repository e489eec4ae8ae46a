package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// fetchTags is the tagged-field section of a Fetch response body of version
// v16 with brokers as its NodeEndpoints and, when other is set, an unknown
// tagged field (tag 5) beside them: the bytes after the body's fixed fields
// and empty topics array.
func fetchTags(t testing.TB, brokers []kmsg.FetchResponseBroker, other bool) []byte {
	t.Helper()
	r := kmsg.NewPtrFetchResponse()
	r.SetVersion(16)
	r.Brokers = brokers
	if other {
		r.UnknownTags.Set(5, []byte("kept"))
	}
	return r.AppendTo(nil)[4+2+4+1:]
}

// checkSameLength decodes out, the section sameLengthTags made of tags,
// and checks what the streamed response promises: the same length, no
// broker host, the unknown tag 5 kept when it was there; it returns the
// endpoints out names.
func checkSameLength(t testing.TB, tags, out []byte, brokerHost string, other bool) []kmsg.FetchResponseBroker {
	t.Helper()
	if len(out) != len(tags) {
		t.Fatalf("tagged fields of %d bytes became %d", len(tags), len(out))
	}
	if bytes.Contains(out, []byte(brokerHost)) {
		t.Fatalf("the broker's host %q is still in %x", brokerHost, out)
	}
	r := kmsg.NewPtrFetchResponse()
	r.SetVersion(16)
	if err := r.ReadFrom(append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, out...)); err != nil {
		t.Fatalf("the rewritten tagged fields do not decode: %v", err)
	}
	kept := false
	r.UnknownTags.Each(func(k uint32, v []byte) {
		if k == 5 {
			kept = string(v) == "kept"
		}
	})
	if kept != other {
		t.Fatalf("unknown tag 5 kept: %v, want %v", kept, other)
	}
	return r.Brokers
}

// The tagged fields of a streamed Fetch response keep their length, whatever
// the proxy's endpoints are: mapped and padded when they are as long as the
// broker's or shorter by 3 bytes or more (room for the pad field), dropped
// otherwise (or when one does not map), never left as the broker's. Every length of the proxy's host from 0 to 300 bytes,
// against broker hosts of 1 to 120 bytes, one and three brokers, with and
// without another tagged field.
func TestSameLengthTagsKeepsLength(t *testing.T) {
	for _, n := range []int{1, 3} {
		for _, bl := range []int{1, 9, 40, 120} {
			for _, other := range []bool{false, true} {
				brokerHost := "B" + strings.Repeat("b", bl-1)
				var brokers []kmsg.FetchResponseBroker
				for i := range n {
					b := kmsg.NewFetchResponseBroker()
					b.NodeID, b.Host, b.Port = int32(i), brokerHost, 9092
					if i == 1 {
						rack := "rack-1"
						b.Rack = &rack
					}
					brokers = append(brokers, b)
				}
				tags := fetchTags(t, brokers, other)
				for pl := range 301 {
					proxyHost := strings.Repeat("p", pl)
					m := func(node int32, host string, port int32) (string, int32, error) {
						if host != brokerHost {
							t.Fatalf("mapper given host %q", host)
						}
						return proxyHost, 19092 + node, nil
					}
					out, err := sameLengthTags(16, tags, m)
					if err != nil {
						t.Fatalf("%d brokers of %d-byte hosts, proxy host of %d: %v", n, bl, pl, err)
					}
					got := checkSameLength(t, tags, out, brokerHost, other)
					// Mapped when as long, or shorter by room for the
					// pad field (3 bytes at least); else dropped.
					short := n * (bl - pl)
					if mapped := short == 0 || short >= 3; mapped != (len(got) == n) || !mapped && len(got) != 0 {
						t.Fatalf("%d brokers of %d-byte hosts, proxy host of %d: %d endpoints, want them mapped: %v", n, bl, pl, len(got), mapped)
					}
					for i, b := range got {
						if b.Host != proxyHost || b.Port != 19092+int32(i) || b.NodeID != int32(i) {
							t.Fatalf("endpoint %d: %+v", i, b)
						}
					}
				}
			}
		}
	}
}

// An endpoint the proxy cannot map drops them all (none rather than the
// broker's); a section without NodeEndpoints is left as it came (nil); one
// that does not decode is errFetchWalk.
func TestSameLengthTagsUnmappedAndMalformed(t *testing.T) {
	b := kmsg.NewFetchResponseBroker()
	b.NodeID, b.Host, b.Port = 7, "broker-7.example.internal", 9092
	tags := fetchTags(t, []kmsg.FetchResponseBroker{b}, true)
	out, err := sameLengthTags(16, tags, func(int32, string, int32) (string, int32, error) {
		return "", 0, errors.New("node 7 unknown")
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := checkSameLength(t, tags, out, b.Host, true); len(got) != 0 {
		t.Fatalf("endpoints %+v, want none", got)
	}
	if out, err := sameLengthTags(16, fetchTags(t, nil, true), nil); out != nil || err != nil {
		t.Fatalf("no NodeEndpoints: %x, %v; want nil, nil", out, err)
	}
	for _, bad := range [][]byte{{1, 0}, {1, 0, 9, 1}, {2, 0, 1, 1}} {
		if _, err := sameLengthTags(16, bad, nil); !errors.Is(err, errFetchWalk) {
			t.Fatalf("%x: %v, want errFetchWalk", bad, err)
		}
	}
}

// Every shape of NodeEndpoints keeps its length without an error, and
// keeps the proxy's endpoints when they fit: 1–4 brokers with hosts of 1–200
// bytes, against proxy hosts of 1 to 250 bytes. Found by a fault-finding
// run on Kafka 4.2.2: with one pad field, a section whose gap was 131 bytes
// (or, once the endpoints were dropped, 132 bytes of tagged fields, such as
// one broker with a 107-byte rack, or three pod-named brokers) could not be
// padded, and the client's connection was closed mid-response.
func TestSameLengthTagsNeverFails(t *testing.T) {
	for n := 1; n <= 4; n++ {
		for bl := 1; bl <= 200; bl++ {
			var brokers []kmsg.FetchResponseBroker
			for i := range n {
				b := kmsg.NewFetchResponseBroker()
				b.NodeID, b.Host, b.Port = int32(i), "B"+strings.Repeat("b", bl-1), 9092
				brokers = append(brokers, b)
			}
			tags := fetchTags(t, brokers, false)
			for _, pl := range []int{1, 9, 20, 60, 250} {
				proxyHost := strings.Repeat("p", pl)
				out, err := sameLengthTags(16, tags, func(node int32, _ string, _ int32) (string, int32, error) {
					return proxyHost, 19092 + node, nil
				})
				if err != nil {
					t.Fatalf("%d brokers of %d-byte hosts (%d bytes of tagged fields), proxy host of %d bytes: %v", n, bl, len(tags), pl, err)
				}
				got := checkSameLength(t, tags, out, brokers[0].Host, false)
				if short := n * (bl - pl); short >= 3 && len(got) != n {
					t.Fatalf("%d brokers of %d-byte hosts, proxy host of %d bytes: %d endpoints, want them mapped", n, bl, pl, len(got))
				}
			}
		}
	}
	for _, tc := range []struct {
		name  string
		hosts []string
		rack  string
		proxy string
	}{
		{"a 107-byte rack (Kafka 4.2.2)", []string{"127.0.0.1"}, strings.Repeat("r", 107), "::ffff:127.0.0.1"},
		{"three pods", []string{"kafka-0.kafka-hl.prod.svc.local", "kafka-1.kafka-hl.prod.svc.local", "kafka-2.kafka-hl.prod.svc.local2"}, "", "ferry-proxy.kafka-edge.prod.example.com"},
		{"300 brokers, over 16 KiB more than the proxy's", slices.Repeat([]string{"kafka-" + strings.Repeat("x", 60) + ".example.internal"}, 300), "", "p"},
	} {
		var brokers []kmsg.FetchResponseBroker
		for i, h := range tc.hosts {
			b := kmsg.NewFetchResponseBroker()
			b.NodeID, b.Host, b.Port = int32(i), h, 9092
			if tc.rack != "" {
				b.Rack = &tc.rack
			}
			brokers = append(brokers, b)
		}
		tags := fetchTags(t, brokers, true)
		out, err := sameLengthTags(16, tags, func(node int32, _ string, _ int32) (string, int32, error) {
			return tc.proxy, 19092 + node, nil
		})
		if err != nil {
			t.Fatalf("%s (%d bytes of tagged fields): %v", tc.name, len(tags), err)
		}
		checkSameLength(t, tags, out, tc.hosts[0], true)
	}
}

func FuzzSameLengthTags(f *testing.F) {
	b := kmsg.NewFetchResponseBroker()
	b.NodeID, b.Host, b.Port = 1, "broker-1", 9092
	f.Add(fetchTags(f, []kmsg.FetchResponseBroker{b}, true), 3)
	f.Add(fetchTags(f, []kmsg.FetchResponseBroker{b, b}, false), 30)
	f.Fuzz(func(t *testing.T, tags []byte, hostLen int) {
		proxyHost := fmt.Sprint("P", strings.Repeat("p", hostLen&0xff))
		var hosts []string
		out, err := sameLengthTags(16, tags, func(_ int32, host string, port int32) (string, int32, error) {
			hosts = append(hosts, host)
			return proxyHost, port, nil
		})
		if err != nil {
			// Only a section that does not decode may fail.
			r := kmsg.NewPtrFetchResponse()
			r.SetVersion(16)
			if r.ReadFrom(append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, tags...)) == nil {
				t.Fatalf("a section kmsg decodes failed: %v", err)
			}
			return
		}
		if out == nil {
			return
		}
		if len(out) != len(tags) {
			t.Fatalf("%d bytes became %d", len(tags), len(out))
		}
		r := kmsg.NewPtrFetchResponse()
		r.SetVersion(16)
		if err := r.ReadFrom(append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, out...)); err != nil {
			t.Fatalf("does not decode: %v", err)
		}
		for _, b := range r.Brokers {
			if b.Host != proxyHost {
				t.Fatalf("endpoint host %q reached the client (the broker's were %q)", b.Host, hosts)
			}
		}
	})
}

// A Fetch response larger than the proxy's read buffer streams through
// (ferry_proxy_fetch_responses_streamed_total), at the first flexible version and at v17: its
// record set reaches the client byte for byte as the broker sent it, and
// when another partition's leader moved (NOT_LEADER_OR_FOLLOWER), the
// response's KIP-951 endpoints, at its end, name the proxy's listeners, not
// the brokers.
func TestFetchStreamedWithEndpoints(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(2, "moved"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	real := brokerAddrs(c)
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Both partitions led by one broker, 100 KB of records in partition 0.
	lead := c.LeaderFor("moved", 0)
	if err := c.MoveTopicPartition("moved", 1, lead); err != nil {
		t.Fatal(err)
	}
	direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	for i := range 10 {
		if err := direct.ProduceSync(ctx, &kgo.Record{Topic: "moved", Partition: 0, Value: randomValue(uint64(i), 10_000)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	fetch := func() *kmsg.FetchRequest {
		r := kmsg.NewPtrFetchRequest()
		r.MaxWaitMillis, r.MaxBytes = 10, 1<<20
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = "moved"
		rt.TopicID = c.TopicInfo("moved").TopicID
		for p := range int32(2) {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.PartitionMaxBytes, rp.CurrentLeaderEpoch = p, 1<<20, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		r.Topics = append(r.Topics, rt)
		return r
	}
	resp, err := direct.Broker(int(lead)).Request(ctx, fetch())
	if err != nil {
		t.Fatal(err)
	}
	want := resp.(*kmsg.FetchResponse).Topics[0].Partitions[0].RecordBatches
	if len(want) < 100_000 {
		t.Fatalf("partition 0 fetched directly: %d bytes of records", len(want))
	}
	// Partition 1's leader moves away.
	if err := c.MoveTopicPartition("moved", 1, 1-lead); err != nil {
		t.Fatal(err)
	}
	for _, version := range []int16{12, 17} {
		versions := kversion.Stable()
		versions.SetMaxKeyVersion(int16(kmsg.Fetch), version)
		cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.MaxVersions(versions))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Request(ctx, kmsg.NewPtrMetadataRequest()); err != nil {
			t.Fatal(err)
		}
		streamed := testutil.ToFloat64(s.m.fetchStreamed)
		resp, err := cl.Broker(int(lead)).Request(ctx, fetch())
		if err != nil {
			t.Fatal(err)
		}
		if testutil.ToFloat64(s.m.fetchStreamed) == streamed {
			t.Fatalf("v%d: the response was not streamed", version)
		}
		r := resp.(*kmsg.FetchResponse)
		if r.Version != version || len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 2 {
			t.Fatalf("v%d: response %+v", version, r)
		}
		for _, p := range r.Topics[0].Partitions {
			switch p.Partition {
			case 0:
				if !bytes.Equal(p.RecordBatches, want) {
					t.Fatalf("v%d: partition 0's records differ from the broker's (%d bytes, want %d)", version, len(p.RecordBatches), len(want))
				}
			case 1:
				if p.ErrorCode != kerr.NotLeaderForPartition.Code {
					t.Fatalf("v%d: partition 1 error %d, want NOT_LEADER_OR_FOLLOWER", version, p.ErrorCode)
				}
			}
		}
		if len(r.Brokers) != 2 {
			t.Fatalf("v%d: %d endpoints, want both brokers (mapped: the proxy's hosts are as long)", version, len(r.Brokers))
		}
		for _, b := range r.Brokers {
			addr := net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
			if got, ok := s.BrokerAddr(b.NodeID); real[addr] || !ok || got != addr {
				t.Fatalf("v%d: node %d's endpoint %s, want the proxy's listener %s", version, b.NodeID, addr, got)
			}
		}
	}
}

// fuzzStreamedFetch builds a Fetch response of version from seed's bytes
// (zeros once they run out): up to three topics (named, or by id from v13)
// of up to three partitions each, with error codes, aborted transactions,
// preferred replicas, record sets null, empty, small or over the read
// buffer, the partition tags (diverging epoch, current leader, an unknown
// one), up to four NodeEndpoints (hosts up to 160 bytes, racks up to 255)
// and an unknown top-level tag. The record
// sets are not batches: the walk does not read them.
func fuzzStreamedFetch(seed []byte, version int16) *kmsg.FetchResponse {
	i := 0
	next := func() int {
		if i >= len(seed) {
			return 0
		}
		i++
		return int(seed[i-1])
	}
	r := kmsg.NewPtrFetchResponse()
	r.SetVersion(version)
	r.ThrottleMillis, r.SessionID = int32(next()), int32(next())
	for range next() % 4 {
		tp := kmsg.NewFetchResponseTopic()
		tp.Topic = strings.Repeat("t", next()%40)
		tp.TopicID[0] = byte(next())
		for p := range next() % 4 {
			pp := kmsg.NewFetchResponseTopicPartition()
			pp.Partition, pp.ErrorCode, pp.HighWatermark = int32(p), int16(next()%3), int64(next())
			for range next() % 3 {
				a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
				a.ProducerID, a.FirstOffset = int64(next()), int64(next())
				pp.AbortedTransactions = append(pp.AbortedTransactions, a)
			}
			pp.PreferredReadReplica = int32(next()) - 1
			switch next() % 4 {
			case 0:
				pp.RecordBatches = nil
			case 1:
				pp.RecordBatches = []byte{}
			case 2:
				pp.RecordBatches = bytes.Repeat([]byte{byte(p)}, next()*7)
			case 3:
				pp.RecordBatches = bytes.Repeat([]byte{byte(p)}, readerSize+next()*1000)
			}
			if next()%3 == 0 {
				pp.CurrentLeader.LeaderID, pp.CurrentLeader.LeaderEpoch = 1, 2
			}
			if next()%4 == 0 {
				pp.DivergingEpoch.Epoch, pp.DivergingEpoch.EndOffset = 3, 4
			}
			if next()%5 == 0 {
				pp.UnknownTags.Set(9, []byte{1, 2})
			}
			tp.Partitions = append(tp.Partitions, pp)
		}
		r.Topics = append(r.Topics, tp)
	}
	for range next() % 5 {
		b := kmsg.NewFetchResponseBroker()
		b.NodeID, b.Host, b.Port = int32(next()), "B"+strings.Repeat("b", next()%160), int32(next())
		if next()%3 == 0 {
			rack := strings.Repeat("r", next())
			b.Rack = &rack
		}
		r.Brokers = append(r.Brokers, b)
	}
	if next()%4 == 0 {
		r.UnknownTags.Set(7, []byte("x"))
	}
	return r
}

// Fetch responses that kmsg encodes (fuzzStreamedFetch, versions 12–17)
// walked as the proxy streams them (fetchWalk: record sets over the read
// buffer spliced through, the rest copied): with no NodeEndpoints the client
// gets the broker's bytes exactly; with them, a frame of the same length that
// kmsg decodes to the same response but for the endpoints (the proxy's, or
// none) and the pad tag.
func FuzzFetchStream(f *testing.F) {
	f.Add([]byte{1, 2, 2, 5, 1, 1, 9, 1, 1, 3, 3, 0, 0, 0}, uint8(0), uint8(3))
	f.Add([]byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 3, 9, 0, 1, 1, 2, 9, 1, 7, 8, 9, 0}, uint8(5), uint8(60))
	f.Add([]byte{9, 9, 3, 30, 7, 3, 1, 2, 2, 1, 2, 3, 4, 3, 200, 1, 1, 1, 2, 1, 5, 9, 2, 2, 20, 9}, uint8(1), uint8(0))
	f.Fuzz(func(t *testing.T, seed []byte, v, hostLen uint8) {
		version := 12 + int16(v%6)
		r := fuzzStreamedFetch(seed, version)
		body := r.AppendTo(nil)
		frame := binary.BigEndian.AppendUint32(nil, uint32(4+1+len(body)))
		frame = append(binary.BigEndian.AppendUint32(frame, 7), 0) // correlation id, no header tags
		frame = append(frame, body...)
		src := bytes.NewReader(frame)
		var out bytes.Buffer
		w := &fetchWalk{ur: bufio.NewReaderSize(src, readerSize), up: src, to: &out, left: int64(len(frame))}
		proxyHost := "P" + strings.Repeat("p", int(hostLen))
		rewritten, err := w.walk(version, func(_ int32, _ string, port int32) (string, int32, error) {
			return proxyHost, port + 1, nil
		})
		if err != nil {
			t.Fatalf("v%d: %v", version, err)
		}
		got := out.Bytes()
		if len(got) != len(frame) {
			t.Fatalf("v%d: a frame of %d bytes went out as %d", version, len(frame), len(got))
		}
		if rewritten != (len(r.Brokers) > 0) {
			t.Fatalf("v%d: rewritten %v with %d endpoints", version, rewritten, len(r.Brokers))
		}
		if !rewritten {
			if !bytes.Equal(got, frame) {
				t.Fatalf("v%d: the frame went out changed", version)
			}
			return
		}
		if !bytes.Equal(got[:9], frame[:9]) {
			t.Fatalf("v%d: size or header changed", version)
		}
		r2 := kmsg.NewPtrFetchResponse()
		r2.SetVersion(version)
		if err := r2.ReadFrom(got[9:]); err != nil {
			t.Fatalf("v%d: the rewritten response does not decode: %v", version, err)
		}
		for _, b := range r2.Brokers {
			if b.Host != proxyHost {
				t.Fatalf("v%d: endpoint host %q reached the client", version, b.Host)
			}
		}
		// Everything else as the broker sent it.
		var tags kmsg.Tags
		r2.UnknownTags.Each(func(k uint32, v []byte) {
			if k != padTag && k != padTag+1 {
				tags.Set(k, v)
			}
		})
		r2.UnknownTags, r2.Brokers = tags, r.Brokers
		if !bytes.Equal(r2.AppendTo(nil), body) {
			t.Fatalf("v%d: the response changed beyond its endpoints", version)
		}
	})
}
