package integration

// Issue 21's validate-schema interceptor against the real schema registry
// (scripts/schema-registry: Apicurio's Confluent-compatible API) and the
// real broker, through a `ferry proxy` process started with flags, as its
// first done-when reads.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/ferrykit/ferry/internal/schemareg"
)

// ordersTopic creates topic (one partition) unless it exists, and returns
// its end offset: the tests read what they append from there.
func ordersTopic(t *testing.T, topic string) int64 {
	t.Helper()
	resp, err := kadm.NewClient(client(t)).CreateTopic(ctxT(t, 30*time.Second), 1, 1, nil, topic)
	if err != nil || (resp.Err != nil && !errors.Is(resp.Err, kerr.TopicAlreadyExists)) {
		t.Fatalf("create topic %s: %v %v", topic, err, resp.Err)
	}
	return endOffset(t, topic)
}

// avroOrder is an Order of ordersAvro in Avro's binary encoding, made by
// hamba/avro (not by the code under test).
func avroOrder(t *testing.T, id int64, item string) []byte {
	t.Helper()
	s, err := avro.Parse(ordersAvro)
	if err != nil {
		t.Fatal(err)
	}
	b, err := avro.Marshal(s, map[string]any{"id": id, "item": item})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kcatProduceFile produces value as one record with kcat (-P FILE: the file
// is the record, any bytes) and returns kcat's stderr and error.
func kcatProduceFile(t *testing.T, via, topic string, value []byte) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "record")
	if err := os.WriteFile(f, value, 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := runClientErr(nil, kcatPath(t), "-P", "-b", via, "-t", topic, "-X", "retries=0", f)
	return string(errOut), err
}

// answerMessage is a produce answer's error_message and its record_errors'
// messages (KIP-467), joined: what the Java producer shows.
func answerMessage(p kmsg.ProduceResponseTopicPartition) string {
	msg := ""
	if p.ErrorMessage != nil {
		msg = *p.ErrorMessage
	}
	for _, re := range p.ErrorRecords {
		if re.ErrorMessage != nil {
			msg += " | record " + strconv.Itoa(int(re.RelativeOffset)) + ": " + *re.ErrorMessage
		}
	}
	return msg
}

// produceAnswer sends value as one record in one Produce request (kmsg,
// acks=all, v12: topics by name) to via and returns the partition's answer:
// its code, the error_message and record_errors (KIP-467) that the Java
// producer shows and librdkafka and franz-go's producer do not.
func produceAnswer(t *testing.T, via, topic string, value []byte) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	var rec []byte
	body := 1 + 1 + 1 + 1 + varintLen(int64(len(value))) + len(value) + 1 // attrs, ts, off, key -1, value len, value, headers
	rec = binary.AppendVarint(rec, int64(body))
	rec = append(rec, 0, 0, 0)
	rec = binary.AppendVarint(rec, -1)
	rec = binary.AppendVarint(rec, int64(len(value)))
	rec = append(rec, value...)
	rec = append(rec, 0)

	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 30000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = rawBatch(rec, 0, 1)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	kr, err := viaClient(t, via).Request(ctxT(t, time.Minute), &pinned{Request: req, v: 12})
	if err != nil {
		t.Fatalf("produce request: %v", err)
	}
	resp := kr.(*kmsg.ProduceResponse)
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("produce response: %+v", resp)
	}
	return resp.Topics[0].Partitions[0]
}

// validateSchemaProxy starts `ferry proxy --interceptors validate-schema
// -X schema.registry.url=URL` (and the extra -X pairs) and returns its
// bootstrap address.
func validateSchemaProxy(t *testing.T, url string, extra ...string) string {
	t.Helper()
	args := []string{"proxy", "--upstream", brokers(t), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
		"--interceptors", "validate-schema", "-X", "schema.registry.url=" + url}
	for _, kv := range extra {
		args = append(args, "-X", kv)
	}
	p := startFerryProc(t, buildFerry(t), args...)
	via, _ := proxyAddrs(t, p)
	return via
}

// The done-when: an Avro schema registered under orders-value; kcat's
// correctly framed record to orders is accepted and read back byte for
// byte; one with an unregistered id, one whose bytes do not decode and an
// unframed one are refused, each with its reason; nothing refused is
// appended.
func TestValidateSchemaKcatAvro(t *testing.T) {
	reg := schemaRegistry(t)
	kcatPath(t)
	url := os.Getenv("FERRY_SCHEMA_REGISTRY_URL")
	ctx := ctxT(t, time.Minute)
	ss, err := reg.CreateSchema(ctx, "orders-value", sr.Schema{Schema: ordersAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatalf("register under orders-value: %v", err)
	}
	// An id the registry knows under another subject only.
	other, err := reg.CreateSchema(ctx, "ferry-other-value", sr.Schema{Schema: `{"type":"record","name":"Other","fields":[{"name":"x","type":"long"}]}`})
	if err != nil {
		t.Fatal(err)
	}
	base := ordersTopic(t, "orders")
	via := validateSchemaProxy(t, url)
	order := avroOrder(t, 42, "widget")
	good := schemareg.AppendFrame(nil, ss.ID, nil, order)

	if errOut, err := kcatProduceFile(t, via, "orders", good); err != nil || strings.Contains(errOut, "ERROR") {
		t.Fatalf("kcat, a framed Avro record with id %d: %v\n%s", ss.ID, err, errOut)
	}
	if off := endOffset(t, "orders"); off != base+1 {
		t.Fatalf("end offset %d after the valid record, want %d", off, base+1)
	}
	unknownID := ss.ID + other.ID + 1000
	for _, tc := range []struct {
		name, reason string
		value        []byte
	}{
		{"unregistered id", "subject orders-value, schema id " + strconv.Itoa(unknownID) + ": schema id not registered under the subject",
			schemareg.AppendFrame(nil, unknownID, nil, order)},
		{"id of another subject", "subject orders-value has not registered schema id " + strconv.Itoa(other.ID),
			schemareg.AppendFrame(nil, other.ID, nil, []byte{2})},
		// The string's length is -64: no Avro reader accepts it.
		{"bytes that do not decode", "subject orders-value, schema id " + strconv.Itoa(ss.ID) + ": payload does not decode",
			schemareg.AppendFrame(nil, ss.ID, nil, []byte{0x54, 0x7f, 'w'})},
		{"trailing bytes", "bytes left after the value", append(bytes.Clone(good), 0)},
		{"unframed", "not in the Confluent wire format", order},
	} {
		errOut, err := kcatProduceFile(t, via, "orders", tc.value)
		if !strings.Contains(errOut, "Broker failed to validate record") {
			t.Fatalf("kcat, %s: exit %v, stderr lacks INVALID_RECORD's text:\n%s", tc.name, err, errOut)
		}
		p := produceAnswer(t, via, "orders", tc.value)
		msg := answerMessage(p)
		if p.ErrorCode != kerr.InvalidRecord.Code || !strings.Contains(msg, tc.reason) {
			t.Fatalf("%s: code %d, message %q; want INVALID_RECORD naming %q", tc.name, p.ErrorCode, msg, tc.reason)
		}
		t.Logf("%s: kcat: %s; the proxy's message: %s", tc.name, firstLine(errOut, "validate"), msg)
	}
	if off := endOffset(t, "orders"); off != base+1 {
		t.Fatalf("end offset %d after the refused records, want %d: nothing refused may be appended", off, base+1)
	}
	var got []byte
	for _, r := range kcatConsume(t, via, "orders") {
		if r.Offset == base {
			got = r.Value
		}
	}
	if !bytes.Equal(got, good) {
		t.Fatalf("read back at offset %d: %x, want %x", base, got, good)
	}
}

func firstLine(s, containing string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, containing) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// flakyForward is a TCP forwarder in front of the registry that the test
// takes down (new connections accepted and closed at once, open ones cut)
// and brings back: a registry outage as the proxy sees it, without touching
// the registry process that scripts/test owns.
type flakyForward struct {
	ln      net.Listener
	target  string
	isDown  atomic.Bool
	refused atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
}

func newFlakyForward(t *testing.T, target string) *flakyForward {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyForward{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); f.down() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if f.isDown.Load() {
				f.refused.Add(1)
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", f.target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, u)
			f.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return f
}

func (f *flakyForward) down() {
	f.isDown.Store(true)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

// Registry down: produces fail with a retriable error (KAFKA_STORAGE_ERROR,
// nothing appended); a producer that retries succeeds once it is back,
// without a proxy restart; nothing invalid is appended.
func TestValidateSchemaRegistryDown(t *testing.T) {
	reg := schemaRegistry(t)
	url := os.Getenv("FERRY_SCHEMA_REGISTRY_URL")
	ctx := ctxT(t, time.Minute)
	topic := clientTopic(t, 1, nil)
	host, path, _ := strings.Cut(strings.TrimPrefix(url, "http://"), "/")
	fw := newFlakyForward(t, host)
	via := validateSchemaProxy(t, "http://"+fw.ln.Addr().String()+"/"+path, "schema.registry.request.timeout.ms=2000")

	fw.down()
	// Registered while the proxy cannot see the registry: the proxy has
	// nothing cached for it.
	ss, err := reg.CreateSchema(ctx, topic+"-value", sr.Schema{Schema: ordersAvro})
	if err != nil {
		t.Fatal(err)
	}
	good := schemareg.AppendFrame(nil, ss.ID, nil, avroOrder(t, 7, "down"))
	p := produceAnswer(t, via, topic, good)
	if p.ErrorCode != kerr.KafkaStorageError.Code {
		t.Fatalf("registry down: code %d, want KAFKA_STORAGE_ERROR (%d)", p.ErrorCode, kerr.KafkaStorageError.Code)
	}
	if p.ErrorMessage != nil {
		t.Logf("registry down: %s", *p.ErrorMessage)
	}
	// A producer that retries, started during the outage: wait until the
	// proxy has been refused by the registry for it too, then end the
	// outage.
	refusedBefore := fw.refused.Load()
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.RecordRetries(1000), kgo.RecordDeliveryTimeout(3*time.Minute))
	done := make(chan error, 1)
	prod.Produce(ctxT(t, 3*time.Minute), &kgo.Record{Value: good}, func(_ *kgo.Record, err error) { done <- err })
	waitFor(t, time.Minute, func() bool { return fw.refused.Load() > refusedBefore },
		func() string { return "the proxy did not call the registry for the retrying producer" })
	select {
	case err := <-done:
		t.Fatalf("the producer finished while the registry was down: %v", err)
	default:
	}
	if off := endOffset(t, topic); off != 0 {
		t.Fatalf("end offset %d while the registry was down, want 0", off)
	}
	fw.isDown.Store(false)
	if err := <-done; err != nil {
		t.Fatalf("after the registry came back: %v", err)
	}
	if off := endOffset(t, topic); off != 1 {
		t.Fatalf("end offset %d after recovery, want 1", off)
	}
	// An invalid record is still refused after recovery.
	if p := produceAnswer(t, via, topic, avroOrder(t, 8, "unframed")); p.ErrorCode != kerr.InvalidRecord.Code {
		t.Fatalf("unframed after recovery: code %d", p.ErrorCode)
	}
	if off := endOffset(t, topic); off != 1 {
		t.Fatalf("end offset %d, want 1: nothing invalid appended", off)
	}
}

// JSON Schema and Protobuf as the real registry serves them (its
// schemaType, Protobuf as schema text), under TopicNameStrategy: valid
// records appended, invalid ones refused with their reason.
func TestValidateSchemaFormats(t *testing.T) {
	reg := schemaRegistry(t)
	url := os.Getenv("FERRY_SCHEMA_REGISTRY_URL")
	ctx := ctxT(t, time.Minute)
	jsonTopic, protoTopic := clientTopic(t, 1, nil), clientTopic(t, 1, nil)
	js, err := reg.CreateSchema(ctx, jsonTopic+"-value", sr.Schema{Schema: ordersJSON, Type: sr.TypeJSON})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := reg.CreateSchema(ctx, protoTopic+"-value", sr.Schema{Schema: ordersProto, Type: sr.TypeProtobuf})
	if err != nil {
		t.Fatal(err)
	}
	via := validateSchemaProxy(t, url)

	protoOrder := []byte{0x08, 0x2a, 0x12, 0x01, 'w'} // id 42, item "w"
	for _, tc := range []struct {
		name, topic string
		value       []byte
		reason      string // "" for accepted
	}{
		{"JSON valid", jsonTopic, schemareg.AppendFrame(nil, js.ID, nil, []byte(`{"id":1,"item":"w"}`)), ""},
		{"JSON missing a required member", jsonTopic, schemareg.AppendFrame(nil, js.ID, nil, []byte(`{"item":"w"}`)), "JSON Schema"},
		{"JSON not JSON", jsonTopic, schemareg.AppendFrame(nil, js.ID, nil, []byte(`{"id":`)), "payload does not decode"},
		{"Protobuf valid", protoTopic, schemareg.AppendFrame(nil, ps.ID, []int{0}, protoOrder), ""},
		{"Protobuf truncated", protoTopic, schemareg.AppendFrame(nil, ps.ID, []int{0}, protoOrder[:4]), "Protobuf dev.ferry.test.Order"},
		{"Protobuf index of no message", protoTopic, schemareg.AppendFrame(nil, ps.ID, []int{3}, protoOrder), "name no message"},
		{"Protobuf id on the JSON topic", jsonTopic, schemareg.AppendFrame(nil, ps.ID, []int{0}, protoOrder), "not registered under the subject"},
	} {
		p := produceAnswer(t, via, tc.topic, tc.value)
		msg := answerMessage(p)
		if tc.reason == "" {
			if p.ErrorCode != 0 {
				t.Fatalf("%s: code %d, %s", tc.name, p.ErrorCode, msg)
			}
			continue
		}
		if p.ErrorCode != kerr.InvalidRecord.Code || !strings.Contains(msg, tc.reason) {
			t.Fatalf("%s: code %d, message %q; want INVALID_RECORD naming %q", tc.name, p.ErrorCode, msg, tc.reason)
		}
	}
	if a, b := endOffset(t, jsonTopic), endOffset(t, protoTopic); a != 1 || b != 1 {
		t.Fatalf("end offsets %d and %d, want 1 and 1: only the valid records appended", a, b)
	}
}

// Field rules (issue 21 item 2, CEL): a proxy with validate-schema and two
// validate.schema.rule.* keys, the real registry: a record that decodes and
// meets both rules is appended; one that breaks a rule is refused with
// INVALID_RECORD naming the rule, the subject and the id; nothing refused
// is appended.
func TestValidateSchemaRules(t *testing.T) {
	reg := schemaRegistry(t)
	url := os.Getenv("FERRY_SCHEMA_REGISTRY_URL")
	topic := "orders-rules-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	ss, err := reg.CreateSchema(ctxT(t, time.Minute), topic+"-value", sr.Schema{Schema: ordersAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	base := ordersTopic(t, topic)
	via := validateSchemaProxy(t, url, "validate.schema.rule.positive-id=value.id > 0",
		"validate.schema.rule.known-item=value.item in ['widget', 'gadget']")
	good := schemareg.AppendFrame(nil, ss.ID, nil, avroOrder(t, 42, "widget"))
	if p := produceAnswer(t, via, topic, good); p.ErrorCode != 0 {
		t.Fatalf("a record that meets the rules: code %d", p.ErrorCode)
	}
	for _, tc := range []struct {
		value []byte
		want  string
	}{
		{schemareg.AppendFrame(nil, ss.ID, nil, avroOrder(t, 0, "widget")), "rule positive-id (value.id > 0) is false"},
		{schemareg.AppendFrame(nil, ss.ID, nil, avroOrder(t, 5, "sprocket")), "rule known-item"},
	} {
		p := produceAnswer(t, via, topic, tc.value)
		msg := answerMessage(p)
		if p.ErrorCode != kerr.InvalidRecord.Code || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "schema id "+strconv.Itoa(ss.ID)) {
			t.Fatalf("code %d, message %q; want INVALID_RECORD naming %q and the schema id", p.ErrorCode, msg, tc.want)
		}
	}
	if off := endOffset(t, topic); off != base+1 {
		t.Fatalf("end offset %d, want %d: nothing refused may be appended", off, base+1)
	}
}
