package integration

// Real third-party clients (kcat, Kafka's Java tools, Python confluent-kafka)
// produce and consume through viaProxy's address: records byte for byte,
// the four codecs, transactions, both consumer group protocols with a
// rebalance, admin topic creation, and metadata that never names the real
// broker port. franz-go checks what they did, through the same address.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// binaryRecords makes n keyed records with random binary values of 0 to
// 3000 bytes (NUL and invalid UTF-8 included) that avoid the bytes in
// except, each carrying headers.
func binaryRecords(seed uint64, n int, prefix, except string, headers []clientHeader) []clientRecord {
	r := rand.New(rand.NewPCG(seed, 1))
	recs := make([]clientRecord, n)
	for i := range recs {
		v := make([]byte, r.IntN(3001))
		for j := range v {
			for {
				v[j] = byte(r.UintN(256))
				if !strings.ContainsRune(except, rune(v[j])) {
					break
				}
			}
		}
		recs[i] = clientRecord{Key: fmt.Appendf(nil, "%s-%03d", prefix, i), Value: v, Headers: headers}
	}
	return recs
}

// textRecords makes n keyed records with random UTF-8 text values (multi-byte
// characters included, no tab or newline) of up to about 2000 bytes, each
// with headers of its own.
func textRecords(seed uint64, n int, prefix string) []clientRecord {
	r := rand.New(rand.NewPCG(seed, 2))
	alphabet := []rune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;!?-_=+/\\\"'{}[]éüß漢字🚀")
	recs := make([]clientRecord, n)
	for i := range recs {
		var v strings.Builder
		for range r.IntN(700) {
			v.WriteRune(alphabet[r.IntN(len(alphabet))])
		}
		recs[i] = clientRecord{
			Key:   fmt.Appendf(nil, "%s-%03d", prefix, i),
			Value: []byte(v.String()),
			Headers: []clientHeader{
				{Key: "client", Value: []byte(prefix)},
				{Key: "seq", Value: []byte(strconv.Itoa(i))},
			},
		}
	}
	return recs
}

// compressibleRecords makes n keyed records whose values compress well, so
// every client really sends compressed batches.
func compressibleRecords(n int, prefix string) []clientRecord {
	recs := make([]clientRecord, n)
	for i := range recs {
		recs[i] = clientRecord{
			Key:     fmt.Appendf(nil, "%s-%03d", prefix, i),
			Value:   []byte(strings.Repeat(fmt.Sprintf("%s record %d; ", prefix, i), 40)),
			Headers: []clientHeader{{Key: "codec", Value: []byte(prefix)}},
		}
	}
	return recs
}

// proxyRecords reads n records of topic from the start through viaProxy
// with franz-go; opts adds consume options (isolation level).
func proxyRecords(t *testing.T, via, topic string, n int, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl := viaClient(t, via, append([]kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	return pollN(t, cl, n)
}

func TestClientsProxyKcat(t *testing.T) {
	kcatPath(t)
	via := viaProxy(t)
	topic := clientTopic(t, 3, nil)
	headers := []clientHeader{{Key: "client", Value: []byte("kcat")}, {Key: "note", Value: []byte("é=ü")}}
	want := binaryRecords(1, 30, "kcat", "\t\n", headers)

	kcatProduce(t, via, topic, want, headers, "-X", "enable.idempotence=true")
	sameRecords(t, "kcat consume", kcatConsume(t, via, topic), want)
	sameRecords(t, "franz-go consume", fromKgo(proxyRecords(t, via, topic, len(want))), want)

	md := runClient(t, nil, kcatPath(t), "-L", "-J", "-b", via, "-t", topic)
	var meta struct {
		Brokers []struct{ Name string } `json:"brokers"`
		Topics  []struct {
			Topic      string
			Partitions []json.RawMessage
		} `json:"topics"`
	}
	if err := json.Unmarshal(md, &meta); err != nil {
		t.Fatalf("kcat -L -J: %v\n%s", err, md)
	}
	if len(meta.Brokers) == 0 || len(meta.Topics) != 1 || meta.Topics[0].Topic != topic || len(meta.Topics[0].Partitions) != 3 {
		t.Fatalf("kcat metadata: want brokers and %s with 3 partitions:\n%s", topic, md)
	}
	noRealBrokerPort(t, via, "kcat -L", md)
}

func TestClientsProxyJava(t *testing.T) {
	kafkaToolsCP(t)
	via := viaProxy(t)
	topic := clientTopic(t, 3, nil)
	want := textRecords(2, 30, "java")

	javaProduce(t, via, topic, want)
	sameRecords(t, "java console consumer", javaConsume(t, via, topic, len(want)), want)
	sameRecords(t, "franz-go consume", fromKgo(proxyRecords(t, via, topic, len(want))), want)

	// The Java admin client's view of the brokers and their API versions.
	av := javaBrokerAPIVersionsRun(t, via)
	for _, api := range []string{"Produce(0)", "Fetch(1)", "Metadata(3)", "ApiVersions(18)"} {
		if !bytes.Contains(av, []byte(api)) {
			t.Fatalf("broker API versions lack %s:\n%s", api, tail(av))
		}
	}
	noRealBrokerPort(t, via, "kafka-broker-api-versions", av)

	t.Run("ProducerPerformance", func(t *testing.T) {
		topic := clientTopic(t, 3, nil)
		const n, size = 20000, 1024
		out := javaPerf(t, via, topic, n, size, "acks=all", "linger.ms=5")
		if !bytes.Contains(out, []byte(strconv.Itoa(n)+" records sent")) {
			t.Fatalf("perf test output lacks %d records sent:\n%s", n, tail(out))
		}
		ends, err := kadm.NewClient(viaClient(t, via)).ListEndOffsets(ctxT(t, 30*time.Second), topic)
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
		if total != n {
			t.Fatalf("topic holds %d records after the perf test, want %d", total, n)
		}
	})
}

func TestClientsProxyPython(t *testing.T) {
	pythonPath(t)
	via := viaProxy(t)
	topic := clientTopic(t, 3, nil)
	headers := []clientHeader{{Key: "client", Value: []byte("python")}, {Key: "bin", Value: []byte{0, '\n', 0xff, '\t'}}}
	want := binaryRecords(3, 30, "python", "", headers)

	pyProduce(t, via, topic, want, "enable.idempotence=true")
	sameRecords(t, "python consume", pyConsume(t, via, topic), want)
	sameRecords(t, "franz-go consume", fromKgo(proxyRecords(t, via, topic, len(want))), want)

	md := pyRun(t, nil, via, nil, "metadata")
	var meta struct {
		Brokers []struct {
			ID   int32
			Host string
			Port int
		}
		Topics []string
	}
	if err := json.Unmarshal(md, &meta); err != nil {
		t.Fatalf("python metadata: %v\n%s", err, md)
	}
	if len(meta.Brokers) == 0 || meta.Brokers[0].Port == 0 || !slices.Contains(meta.Topics, topic) {
		t.Fatalf("python metadata: want brokers and topic %s:\n%s", topic, md)
	}
	noRealBrokerPort(t, via, "python metadata", md)
}

// kafkaCodecs are Kafka's compression codecs by their record-batch
// attribute id.
var kafkaCodecs = []struct {
	name string
	id   uint8
}{{"gzip", 1}, {"snappy", 2}, {"lz4", 3}, {"zstd", 4}}

// Each client produces with each codec and consumes its records back; the
// batches Kafka returns carry that codec.
func TestClientsProxyCodecs(t *testing.T) {
	via := viaProxy(t)
	clients := []struct {
		name    string
		need    func(testing.TB) string // skips, or fails under CI, without the client
		produce func(t *testing.T, topic, codec string, recs []clientRecord)
		consume func(t *testing.T, topic string, n int) []clientRecord
	}{
		{"kcat", kcatPath, func(t *testing.T, topic, codec string, recs []clientRecord) {
			kcatProduce(t, via, topic, recs, recs[0].Headers, "-z", codec)
		}, func(t *testing.T, topic string, n int) []clientRecord {
			return kcatConsume(t, via, topic)
		}},
		{"java", kafkaToolsCP, func(t *testing.T, topic, codec string, recs []clientRecord) {
			javaProduce(t, via, topic, recs, "--compression-codec", codec)
		}, func(t *testing.T, topic string, n int) []clientRecord {
			return javaConsume(t, via, topic, n)
		}},
		{"python", pythonPath, func(t *testing.T, topic, codec string, recs []clientRecord) {
			pyProduce(t, via, topic, recs, "compression.type="+codec)
		}, func(t *testing.T, topic string, n int) []clientRecord {
			return pyConsume(t, via, topic)
		}},
	}
	for _, c := range clients {
		for _, codec := range kafkaCodecs {
			t.Run(c.name+"/"+codec.name, func(t *testing.T) {
				c.need(t)
				topic := clientTopic(t, 1, nil)
				want := compressibleRecords(20, c.name+"-"+codec.name)
				c.produce(t, topic, codec.name, want)
				sameRecords(t, c.name+" consume", c.consume(t, topic, len(want)), want)
				got := proxyRecords(t, via, topic, len(want))
				for _, r := range got {
					if ct := r.Attrs.CompressionType(); ct != codec.id {
						t.Fatalf("record at offset %d is in a batch with codec %d, want %s (%d)", r.Offset, ct, codec.name, codec.id)
					}
				}
				sameRecords(t, "franz-go consume", fromKgo(got), want)
			})
		}
	}
}

// A transactional producer (Python) aborts one transaction, commits one and
// aborts another; read_committed consumers of every client see only the
// committed records, read_uncommitted ones see all.
func TestClientsProxyTransactions(t *testing.T) {
	pythonPath(t)
	kcatPath(t)
	kafkaToolsCP(t)
	via := viaProxy(t)
	topic := clientTopic(t, 2, nil)
	aborted1 := binaryRecords(4, 5, "aborted1", "\t\n", nil)
	committed := binaryRecords(5, 6, "committed", "\t\n", nil)
	aborted2 := binaryRecords(6, 4, "aborted2", "\t\n", nil)
	pyTxnProduce(t, via, topic, "ferry-"+topic, []pyTxn{{aborted1, false}, {committed, true}, {aborted2, false}})
	all := slices.Concat(aborted1, committed, aborted2)

	sameRecords(t, "python read_committed", pyConsume(t, via, topic, "isolation.level=read_committed"), committed)
	sameRecords(t, "python read_uncommitted", pyConsume(t, via, topic, "isolation.level=read_uncommitted"), all)
	sameRecords(t, "kcat read_committed", kcatConsume(t, via, topic, "-X", "isolation.level=read_committed"), committed)
	sameRecords(t, "kcat read_uncommitted", kcatConsume(t, via, topic, "-X", "isolation.level=read_uncommitted"), all)
	sameRecords(t, "franz-go read_committed", fromKgo(proxyRecords(t, via, topic, len(committed), kgo.FetchIsolationLevel(kgo.ReadCommitted()))), committed)

	// The Java console consumer's values must be text: a second round with
	// text records. A plain record after the trailing aborted transaction
	// lets it stop at a count instead of an idle time (5 s was too short
	// for its first fetch at load average 30): an aborted record delivered
	// would take one of the 6 places, ahead of the sentinel.
	jtopic := clientTopic(t, 2, nil)
	jAborted, jCommitted := textRecords(7, 5, "jaborted"), textRecords(8, 5, "jcommitted")
	pyTxnProduce(t, via, jtopic, "ferry-"+jtopic, []pyTxn{{jAborted, false}, {jCommitted, true}, {textRecords(9, 3, "jaborted2"), false}})
	sentinel := textRecords(10, 1, "jsentinel")
	pyProduce(t, via, jtopic, sentinel)
	want := slices.Concat(jCommitted, sentinel)
	sameRecords(t, "java read_committed", javaConsume(t, via, jtopic, len(want), "--isolation-level", "read_committed"), want)
}

// ---------------------------------------------------------------- groups

// groupTopic makes a 4-partition topic and a franz-go producer through
// viaProxy that writes record i to partition i%4.
func groupTopic(t *testing.T, via string) (string, func(prefix string, n int) []clientRecord) {
	topic := clientTopic(t, 4, nil)
	cl := viaClient(t, via, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	produce := func(prefix string, n int) []clientRecord {
		t.Helper()
		recs := textRecords(uint64(len(prefix)), n, prefix)
		ks := make([]*kgo.Record, n)
		for i, r := range recs {
			ks[i] = &kgo.Record{Partition: int32(i % 4), Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				ks[i].Headers = append(ks[i].Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
			}
		}
		if err := cl.ProduceSync(ctxT(t, 30*time.Second), ks...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
		return recs
	}
	return topic, produce
}

// pyMemberState is what a Python group member reported: its partitions
// now and the records it consumed.
type pyMemberState struct {
	owned   map[int32]bool
	revoked int
	records []clientRecord
	closed  bool
}

func pyState(t *testing.T, m *groupMember) pyMemberState {
	t.Helper()
	s := pyMemberState{owned: map[int32]bool{}}
	for _, line := range m.Lines() {
		var ev struct {
			pyRecord
			Partitions []int32 `json:"partitions"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("%s printed %q: %v", m.name, line, err)
		}
		switch ev.Event {
		case "assigned":
			for _, p := range ev.Partitions {
				s.owned[p] = true
			}
		case "revoked":
			s.revoked++
			for _, p := range ev.Partitions {
				delete(s.owned, p)
			}
		case "record":
			r, err := ev.record()
			if err != nil {
				t.Fatalf("%s record %q: %v", m.name, line, err)
			}
			s.records = append(s.records, r)
		case "closed":
			s.closed = true
		default:
			t.Fatalf("%s printed unknown event %q", m.name, line)
		}
	}
	return s
}

// groupProtocols are the consumer group protocols: classic (JoinGroup/
// SyncGroup) and KIP-848's consumer protocol (ConsumerGroupHeartbeat).
var groupProtocols = []string{"classic", "consumer"}

// checkGroupType checks that the broker lists group as being of the type
// (protocol) the members were asked to use.
func checkGroupType(t *testing.T, adm *kadm.Client, group, protocol string) {
	t.Helper()
	listed, err := adm.ListGroupsByType(ctxT(t, 30*time.Second), []string{protocol})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := listed[group]; !ok {
		t.Fatalf("group %s is not listed among %s groups: %v", group, protocol, slices.Collect(maps.Keys(listed)))
	}
}

// Two Python members: the first gets all four partitions and reads the
// first records; a second joins, the group rebalances (each owns part,
// together all); then every later record is read by its owner, all exactly
// once.
func TestClientsProxyGroupsPython(t *testing.T) {
	py := pythonPath(t)
	via := viaProxy(t)
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) {
			topic, produce := groupTopic(t, via)
			group := "ferry-" + topic
			adm := kadm.NewClient(viaClient(t, via))
			var props []string
			if protocol == "classic" {
				props = append(props, "heartbeat.interval.ms=500")
			}
			member := func(name string) *groupMember {
				return startMember(t, name, true, py, pyArgs(via, append(props, "client.id="+name), "group-consume", topic, "--group", group, "--protocol", protocol)...)
			}
			first := produce("before", 20)
			a := member("a")
			waitFor(t, time.Minute, func() bool {
				s := pyState(t, a)
				return len(s.owned) == 4 && len(s.records) == len(first)
			}, func() string { return fmt.Sprintf("member a: %+v\n%s", pyState(t, a), a.Stderr()) })
			checkGroupType(t, adm, group, protocol)

			b := member("b")
			waitFor(t, time.Minute, func() bool {
				sa, sb := pyState(t, a), pyState(t, b)
				if len(sa.owned) == 0 || len(sb.owned) == 0 || len(sa.owned)+len(sb.owned) != 4 {
					return false
				}
				for p := range sb.owned {
					if sa.owned[p] {
						return false
					}
				}
				return true
			}, func() string {
				return fmt.Sprintf("no rebalance to two members: a %+v, b %+v\n%s\n%s", pyState(t, a).owned, pyState(t, b).owned, a.Stderr(), b.Stderr())
			})
			if sa := pyState(t, a); sa.revoked == 0 {
				t.Fatalf("member a kept partitions %v without a revocation", sa.owned)
			}

			second := produce("after", 20)
			waitFor(t, time.Minute, func() bool {
				return len(pyState(t, a).records)+len(pyState(t, b).records) >= len(first)+len(second)
			}, func() string {
				return fmt.Sprintf("a read %d, b read %d, want %d in all", len(pyState(t, a).records), len(pyState(t, b).records), len(first)+len(second))
			})
			sa, sb := pyState(t, a), pyState(t, b)
			sameRecords(t, "group a+b", slices.Concat(sa.records, sb.records), slices.Concat(first, second))
			for name, s := range map[string]pyMemberState{"a": sa, "b": sb} {
				for _, r := range s.records {
					if bytes.HasPrefix(r.Key, []byte("after")) && !s.owned[r.Partition] {
						t.Fatalf("member %s read %v from a partition it does not own (%v)", name, r, s.owned)
					}
				}
			}
			b.stop()
			a.stop()
			if !pyState(t, a).closed || !pyState(t, b).closed {
				t.Fatalf("members did not leave the group cleanly:\n%s\n%s", a.Stderr(), b.Stderr())
			}
			waitGroupEmpty(t, adm, group, protocol)
		})
	}
}

// groupAssignment describes group (of the protocol) through viaProxy and
// returns each member's assigned partitions of topic.
func groupAssignment(t *testing.T, adm *kadm.Client, group, protocol, topic string) (map[string][]int32, error) {
	ctx := ctxT(t, 30*time.Second)
	out := map[string][]int32{}
	if protocol == "consumer" {
		ds, err := adm.DescribeConsumerGroups(ctx, group)
		if err != nil {
			return nil, err
		}
		d := ds[group]
		if d.Err != nil {
			return nil, d.Err
		}
		for _, m := range d.Members {
			out[m.MemberID] = slices.Sorted(maps.Keys(m.Assignment[topic]))
		}
		return out, nil
	}
	ds, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, err
	}
	d := ds[group]
	if d.Err != nil {
		return nil, d.Err
	}
	if d.State != "Stable" {
		return nil, fmt.Errorf("group state %s", d.State)
	}
	for _, m := range d.Members {
		a, ok := m.Assigned.AsConsumer()
		if !ok {
			return nil, fmt.Errorf("member %s: no consumer assignment", m.MemberID)
		}
		for _, tp := range a.Topics {
			if tp.Topic == topic {
				out[m.MemberID] = tp.Partitions
			}
		}
	}
	return out, nil
}

// waitGroupEmpty waits until group (of the protocol) has no members left.
func waitGroupEmpty(t *testing.T, adm *kadm.Client, group, protocol string) {
	t.Helper()
	var members int
	var err error
	waitFor(t, 30*time.Second, func() bool {
		ctx := ctxT(t, 30*time.Second)
		if protocol == "consumer" {
			var ds kadm.DescribedConsumerGroups
			if ds, err = adm.DescribeConsumerGroups(ctx, group); err == nil {
				err = ds[group].Err
				members = len(ds[group].Members)
			}
		} else {
			var ds kadm.DescribedGroups
			if ds, err = adm.DescribeGroups(ctx, group); err == nil {
				err = ds[group].Err
				members = len(ds[group].Members)
			}
		}
		return err == nil && members == 0
	}, func() string { return fmt.Sprintf("group %s still has %d members (%v)", group, members, err) })
}

// Two Java console consumers in one group: the first reads the first
// records, a second joins and the broker shows both owning part of the
// partitions; the later records are read once in all.
func TestClientsProxyGroupsJava(t *testing.T) {
	kafkaToolsCP(t)
	via := viaProxy(t)
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) {
			topic, produce := groupTopic(t, via)
			group := "ferry-" + topic
			adm := kadm.NewClient(viaClient(t, via))
			member := func(name string) *groupMember {
				args := append([]string{
					"--bootstrap-server", via, "--topic", topic, "--group", group,
					"--command-property", "group.protocol=" + protocol,
					"--command-property", "client.id=" + name,
					"--command-property", "auto.offset.reset=earliest",
				}, javaConsumerArgs...)
				if protocol == "classic" {
					args = append(args, "--command-property", "heartbeat.interval.ms=500")
				}
				return startMember(t, name, false, "java", javaArgs(t, javaConsoleConsumer, args...)...)
			}
			records := func(m *groupMember) []clientRecord {
				var out bytes.Buffer
				for _, l := range m.Lines() {
					out.WriteString(l + "\n")
				}
				recs, err := parseJavaConsole(out.Bytes())
				if err != nil {
					t.Fatalf("%s: %v", m.name, err)
				}
				return recs
			}
			// owners waits for a stable assignment of all 4 partitions to n members.
			owners := func(n int) map[string][]int32 {
				var last map[string][]int32
				var lastErr error
				waitFor(t, time.Minute, func() bool {
					last, lastErr = groupAssignment(t, adm, group, protocol, topic)
					if lastErr != nil || len(last) != n {
						return false
					}
					seen := map[int32]bool{}
					for _, ps := range last {
						if len(ps) == 0 {
							return false
						}
						for _, p := range ps {
							if seen[p] {
								return false
							}
							seen[p] = true
						}
					}
					return len(seen) == 4
				}, func() string { return fmt.Sprintf("assignment %v, %v", last, lastErr) })
				return last
			}

			first := produce("before", 20)
			a := member("a")
			owners(1)
			waitFor(t, time.Minute, func() bool { return len(records(a)) >= len(first) },
				func() string {
					return fmt.Sprintf("member a read %d of %d\n%s", len(records(a)), len(first), a.Stderr())
				})
			checkGroupType(t, adm, group, protocol)

			b := member("b")
			owners(2)
			second := produce("after", 20)
			want := slices.Concat(first, second)
			waitFor(t, time.Minute, func() bool { return len(records(a))+len(records(b)) >= len(want) },
				func() string {
					return fmt.Sprintf("a read %d, b read %d, want %d\n%s\n%s", len(records(a)), len(records(b)), len(want), a.Stderr(), b.Stderr())
				})
			if len(records(b)) == 0 {
				t.Fatalf("member b read nothing after the rebalance")
			}
			// Let a duplicate (a record read twice) show up before the check.
			time.Sleep(time.Second)
			sameRecords(t, "group a+b", slices.Concat(records(a), records(b)), want)
			// SIGINT makes each console consumer close its consumer, which
			// leaves the group.
			b.stop()
			a.stop()
			waitGroupEmpty(t, adm, group, protocol)
		})
	}
}

// brokerHasTopics checks, directly on the broker, that each topic exists
// with the partition count given.
func brokerHasTopics(t *testing.T, want map[string]int) {
	t.Helper()
	td, err := kadm.NewClient(client(t)).ListTopics(ctxT(t, 30*time.Second), slices.Collect(maps.Keys(want))...)
	if err != nil {
		t.Fatal(err)
	}
	for name, n := range want {
		d, ok := td[name]
		if !ok || d.Err != nil || len(d.Partitions) != n {
			t.Fatalf("topic %s on the broker: present %v, err %v, %d partitions; want %d", name, ok, d.Err, len(d.Partitions), n)
		}
	}
}

// Admin clients create topics through viaProxy (CreateTopics): Python's
// AdminClient and Kafka's kafka-topics tool. The broker has them with the
// partition counts asked for, and creating one again fails with Kafka's
// TOPIC_ALREADY_EXISTS.
func TestClientsProxyAdminCreateTopics(t *testing.T) {
	t.Run("python", func(t *testing.T) {
		py := pythonPath(t)
		via := viaProxy(t)
		base := fmt.Sprintf("ferry-cl-admin-py-%d-%d", time.Now().UnixNano()%1e6, topicSeq.Add(1))
		pyRun(t, nil, via, nil, "create-topics", base+"-a:3", base+"-b:1")
		brokerHasTopics(t, map[string]int{base + "-a": 3, base + "-b": 1})

		_, stderr, err := runClientErr(nil, py, pyArgs(via, nil, "create-topics", base+"-a:3")...)
		if err == nil || !bytes.Contains(stderr, []byte("TOPIC_ALREADY_EXISTS")) {
			t.Fatalf("creating %s again: %v, want TOPIC_ALREADY_EXISTS; stderr:\n%s", base+"-a", err, stderr)
		}
	})
	t.Run("java", func(t *testing.T) {
		kafkaToolsCP(t)
		via := viaProxy(t)
		name := fmt.Sprintf("ferry-cl-admin-java-%d-%d", time.Now().UnixNano()%1e6, topicSeq.Add(1))
		javaTool(t, nil, javaTopicCommand, "--bootstrap-server", via, "--create", "--topic", name,
			"--partitions", "2", "--replication-factor", "1", "--config", "compression.type=zstd")
		brokerHasTopics(t, map[string]int{name: 2})
		desc := javaTool(t, nil, javaTopicCommand, "--bootstrap-server", via, "--describe", "--topic", name)
		if !bytes.Contains(desc, []byte("PartitionCount: 2")) || !bytes.Contains(desc, []byte("compression.type=zstd")) {
			t.Fatalf("kafka-topics --describe %s:\n%s", name, desc)
		}
	})
}
