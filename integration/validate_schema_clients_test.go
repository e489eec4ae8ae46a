package integration

// Issue 21, items 3 and 5: schema-framed Avro records through a `ferry
// proxy` process whose chain is [validate-schema, large-message], in front
// of the real broker, the real schema registry (scripts/schema-registry)
// and the real S3 server: Python confluent-kafka's own AvroSerializer and
// AvroDeserializer (testdata/py/avroclient.py), and a 100 MiB record from
// franz-go.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/schemareg"
	"github.com/ferrykit/ferry/largemessage"
)

// schemaChainProxy starts `ferry proxy --config` with the chain
// [validate-schema, large-message] for topic (the registry at
// FERRY_SCHEMA_REGISTRY_URL, payloads to storeURL); proxyKeys are more
// top-level YAML lines (the proxy's own limits).
func schemaChainProxy(t *testing.T, topic, storeURL string, proxyKeys ...string) *ferryProxy {
	t.Helper()
	cfg := fmt.Sprintf(`upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
%s
interceptors:
  - name: validate-schema
    config:
      topic.pattern: %q
      schema.registry.url: %q
  - name: large-message
    config:
      topic.pattern: %q
      large.message.payload.store.url: %q
`, brokers(t), strings.Join(proxyKeys, "\n"), topic, os.Getenv("FERRY_SCHEMA_REGISTRY_URL"), topic, storeURL)
	return startFerryProxy(t, buildFerry(t), cfg)
}

// pyAvroOutcome is one line of avroclient.py produce.
type pyAvroOutcome struct {
	Index     int
	Partition *int32
	Offset    *int64
	Error     string
	Code      string
	Sent      []byte // the refused bytes (base64 in the JSON)
}

// pyAvro runs avroclient.py with the registry, --bytes-field blob and args.
func pyAvro(t *testing.T, stdin []byte, via string, args ...string) []byte {
	t.Helper()
	script := filepath.Join("testdata", "py", "avroclient.py")
	a := append([]string{script, "--bootstrap", via, "--registry", os.Getenv("FERRY_SCHEMA_REGISTRY_URL"),
		"--bytes-field", "blob"}, args...)
	return runClient(t, stdin, pythonPath(t), a...)
}

// pyAvroProduce produces lines (avroclient.py's JSON records) with
// AvroSerializer under schema and returns each record's outcome.
func pyAvroProduce(t *testing.T, via, topic, schema string, lines []any, args ...string) []pyAvroOutcome {
	t.Helper()
	f := filepath.Join(t.TempDir(), "schema.avsc")
	if err := os.WriteFile(f, []byte(schema), 0o600); err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, l := range lines {
		if err := enc.Encode(l); err != nil {
			t.Fatal(err)
		}
	}
	// librdkafka refuses a record over message.max.bytes (default
	// 1000000) before sending it.
	a := append([]string{"-X", "message.max.bytes=33554432", "-X", "request.timeout.ms=120000",
		"produce", topic, "--schema", f}, args...)
	outs := jsonLines[pyAvroOutcome](t, pyAvro(t, in.Bytes(), via, a...))
	if len(outs) != len(lines) {
		t.Fatalf("python produced %d outcomes for %d records", len(outs), len(lines))
	}
	return outs
}

// blobJSON is a Blob as avroclient.py reads and prints it (bytes in base64).
type blobJSON struct {
	ID   int64  `json:"id"`
	Item string `json:"item"`
	Blob []byte `json:"blob"`
}

// Python's Confluent AvroSerializer through [validate-schema,
// large-message]: small records and a 20 MiB one are accepted (the large
// one offloaded: the broker holds a reference), and AvroDeserializer reads
// them back through the proxy equal to what was sent; a record the
// serializer framed under another subject's schema, one framed with an id
// the registry never gave and an unframed one are refused with
// INVALID_RECORD, the proxy's reason naming the subject and id, and none is
// appended.
//
// The proxy needs no limit raised for 20 MiB: socket.request.max.bytes
// (100 MiB), proxy.memory.max.bytes (512 MiB) and
// interceptor.batch.decompressed.max.bytes (100 MiB) hold it at their
// defaults; the client's message.max.bytes is raised (librdkafka's default
// is 1000000).
func TestValidateSchemaPythonAvro(t *testing.T) {
	reg := schemaRegistry(t)
	pythonPath(t)
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	p := schemaChainProxy(t, topic, storeURL)
	via := p.bootstrap

	sent := []blobJSON{
		{1, "small-1", randomBytes(2101, 100)},
		{2, "small-2", []byte{}},
		{3, "large-20MiB", randomBytes(2103, 20<<20)},
		{4, "small-4", randomBytes(2104, 3000)},
	}
	var lines []any
	for _, b := range sent {
		lines = append(lines, map[string]any{"key": []byte(b.Item), "value": b})
	}
	for i, o := range pyAvroProduce(t, via, topic, blobAvro, lines) {
		if o.Error != "" || o.Offset == nil || *o.Offset != int64(i) {
			t.Fatalf("python AvroSerializer, record %d (%s) through the proxy: %+v", i, sent[i].Item, o)
		}
	}
	// The serializer registered the schema under TopicNameStrategy's subject.
	ss, err := reg.SchemaByVersion(ctxT(t, time.Minute), topic+"-value", -1)
	if err != nil {
		t.Fatalf("the schema python registered under %s-value: %v", topic, err)
	}

	// The broker holds the small records as framed Avro, the large one as
	// a reference (the large-message header), made from the framed bytes.
	raw := consumeRaw(t, topic, len(sent))
	for i, r := range raw {
		big := len(sent[i].Blob) > 1<<20
		if largemessage.IsOffloaded(r) != big || (big && len(r.Value) > 1024) {
			t.Fatalf("broker holds %s as %d bytes (offloaded=%v)", sent[i].Item, len(r.Value), largemessage.IsOffloaded(r))
		}
		if !big {
			if id, ok := frameID(r.Value); !ok || id != ss.ID {
				t.Fatalf("broker holds %s not framed with schema id %d: % x", sent[i].Item, ss.ID, r.Value[:min(8, len(r.Value))])
			}
		}
	}

	// Refused: AvroSerializer's own framing of a schema registered under
	// another subject (the id is real, not the topic's), an id the
	// registry never gave, and an Avro record without the framing.
	other := `{"type":"record","name":"Other","namespace":"dev.ferry.test","fields":[{"name":"x","type":"long"}]}`
	unknownID := ss.ID + 100000
	payload := avroOrder(t, 42, "unframed order") // first byte 0x54, not the magic byte
	bad := []any{
		map[string]any{"value": map[string]any{"x": 7}},
		map[string]any{"raw": schemareg.AppendFrame(nil, unknownID, nil, payload)},
		map[string]any{"raw": payload},
	}
	reasons := []string{
		"subject " + topic + "-value has not registered schema id",
		fmt.Sprintf("subject %s-value, schema id %d: schema id not registered under the subject", topic, unknownID),
		"not in the Confluent wire format",
	}
	outs := pyAvroProduce(t, via, topic, other, bad, "--subject", topic+"-other")
	for i, o := range outs {
		if o.Code != "INVALID_RECORD" {
			t.Fatalf("refused record %d: %+v, want INVALID_RECORD", i, o)
		}
		// librdkafka shows INVALID_RECORD's text, not the broker's
		// error_message (KIP-467); the proxy's reason for these same bytes:
		ans := produceAnswer(t, via, topic, o.Sent)
		msg := answerMessage(ans)
		if ans.ErrorCode != kerr.InvalidRecord.Code || !strings.Contains(msg, reasons[i]) {
			t.Fatalf("refused record %d: the proxy answers code %d %q, want INVALID_RECORD naming %q", i, ans.ErrorCode, msg, reasons[i])
		}
		t.Logf("refused record %d: python sees %s (%s); the proxy's message: %s", i, o.Code, o.Error, msg)
	}
	if off := endOffset(t, topic); off != int64(len(sent)) {
		t.Fatalf("end offset %d, want %d: nothing refused may be appended", off, len(sent))
	}

	// AvroDeserializer through the proxy reads what AvroSerializer wrote.
	type consumed struct {
		Offset int64
		Key    []byte
		Value  *blobJSON
		Error  string
	}
	got := jsonLines[consumed](t, pyAvro(t, nil, via, "consume", topic))
	if len(got) != len(sent) {
		t.Fatalf("python consumed %d records, want %d", len(got), len(sent))
	}
	for i, c := range got {
		if c.Error != "" || c.Value == nil {
			t.Fatalf("python AvroDeserializer at offset %d: %s", c.Offset, c.Error)
		}
		if c.Offset != int64(i) || string(c.Key) != sent[i].Item || !reflect.DeepEqual(*c.Value, sent[i]) {
			t.Fatalf("python AvroDeserializer at offset %d: key %q, id %d item %q, %d bytes; want %q, %d bytes",
				c.Offset, c.Key, c.Value.ID, c.Value.Item, len(c.Value.Blob), sent[i].Item, len(sent[i].Blob))
		}
	}
}

// frameID is the schema id of a value in Confluent's wire format.
func frameID(b []byte) (int, bool) {
	if len(b) < 5 || b[0] != 0 {
		return 0, false
	}
	return int(binary.BigEndian.Uint32(b[1:5])), true
}

// framedBlob is a Blob of blobAvro (id, item and n bytes from seed)
// framed with schemaID: Avro's binary encoding written out (zig-zag varints, a
// length before each string and bytes) so that the n bytes are allocated
// once.
func framedBlob(schemaID int, id int64, item string, seed uint64, n int) []byte {
	var head []byte
	head = schemareg.AppendFrame(head, schemaID, nil, nil)
	head = binary.AppendVarint(head, id)
	head = binary.AppendVarint(head, int64(len(item)))
	head = append(head, item...)
	head = binary.AppendVarint(head, int64(n))
	b := make([]byte, len(head)+n)
	copy(b, head)
	fillRandom(seed, b[len(head):])
	return b
}

// fillRandom fills b with randomBytes(seed, len(b))'s bytes, without a
// second buffer.
func fillRandom(seed uint64, b []byte) {
	_, _ = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 7}).Read(b)
}

// Item 3: a 100 MiB Avro record (franz-go) through [validate-schema,
// large-message] is validated, offloaded (the broker holds a reference, the
// store the framed bytes) and read back byte for byte by a franz-go consumer
// through the proxy, which franz-go's sr.Serde decodes; the same bytes with
// an unknown id are refused; the proxy's peak RSS stays under
// docs/SECURITY.md's bound.
//
// One key is raised: socket.request.max.bytes (default 104857600, exactly
// 100 MiB), which a Produce request carrying 100 MiB of value exceeds, to
// 128 MiB. proxy.memory.max.bytes (512 MiB), and
// interceptor.batch.decompressed.max.bytes (100 MiB; the batch is not
// compressed) stay at their defaults. produce.request.interceptor.timeout.ms
// is raised from 5 s to 60 s as a margin: the store write of 100 MiB took
// about 2.5 s on a loaded machine, close to the default 5 s per call.
func TestValidateSchemaAvro100MiB(t *testing.T) {
	reg := schemaRegistry(t)
	storeURL := interceptorStoreURL(t)
	topic := clientTopic(t, 1, nil)
	ss, err := reg.CreateSchema(ctxT(t, time.Minute), topic+"-value", sr.Schema{Schema: blobAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	const maxConns = 64
	p := schemaChainProxy(t, topic, storeURL, "socket.request.max.bytes: 134217728",
		"produce.request.interceptor.timeout.ms: 60000", fmt.Sprintf("max.connections: %d", maxConns))

	value := framedBlob(ss.ID, 100, "large-100MiB", 100, 100<<20)
	start := time.Now()
	// franz-go refuses a record over ProducerBatchMaxBytes (default
	// 1000012) and a request over BrokerMaxWriteBytes (default 100 MiB).
	prod := viaClient(t, p.bootstrap, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(120<<20),
		kgo.BrokerMaxWriteBytes(128<<20), kgo.MaxBufferedBytes(256<<20), kgo.ProduceRequestTimeout(2*time.Minute),
		kgo.RecordDeliveryTimeout(4*time.Minute))
	if err := prod.ProduceSync(ctxT(t, 4*time.Minute), &kgo.Record{Value: value}).FirstErr(); err != nil {
		t.Fatalf("produce 100 MiB of Avro through the proxy: %v", err)
	}
	t.Logf("produced %d bytes in %v", len(value), time.Since(start).Round(time.Millisecond))

	raw := consumeRaw(t, topic, 1)[0]
	if !largemessage.IsOffloaded(raw) || len(raw.Value) > 1024 {
		t.Fatalf("broker holds %d bytes (offloaded=%v), want a reference", len(raw.Value), largemessage.IsOffloaded(raw))
	}
	ref, err := largemessage.DecodeReference(raw.Value)
	if err != nil {
		t.Fatal(err)
	}
	// The store holds the framed bytes as produced (streamed, hashed).
	rc, err := openStore(t, storeURL).Download(ctxT(t, 2*time.Minute), ref.FullPayloadPath)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, rc)
	rc.Close()
	if want := sha256.Sum256(value); err != nil || n != int64(len(value)) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("the stored payload: %d bytes, %v; want the %d framed bytes produced", n, err, len(value))
	}

	// A refused record of the same size is refused whole: the reason, not
	// a store write.
	bad := bytes.Clone(value[:5])
	bad[4]++ // another schema id
	bad = append(bad, value[5:]...)
	if err := prod.ProduceSync(ctxT(t, 4*time.Minute), &kgo.Record{Value: bad}).FirstErr(); err == nil || !strings.Contains(err.Error(), "INVALID_RECORD") {
		t.Fatalf("100 MiB framed with an unknown id: %v, want INVALID_RECORD", err)
	}
	bad = nil

	start = time.Now()
	cons := viaClient(t, p.bootstrap, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(128<<20), kgo.FetchMaxPartitionBytes(128<<20), kgo.BrokerMaxReadBytes(256<<20))
	got := pollN(t, cons, 1)[0]
	if got.Offset != 0 || !bytes.Equal(got.Value, value) || len(got.Headers) != 0 {
		t.Fatalf("read back through the proxy: offset %d, %d bytes (equal %v), headers %v", got.Offset, len(got.Value),
			bytes.Equal(got.Value, value), got.Headers)
	}
	t.Logf("read back %d bytes in %v", len(got.Value), time.Since(start).Round(time.Millisecond))
	value = nil
	// A consumer's own deserializer reads it: franz-go's sr.Serde with
	// hamba/avro.
	schema, err := avro.Parse(blobAvro)
	if err != nil {
		t.Fatal(err)
	}
	// hamba/avro refuses bytes over Config.MaxByteSliceSize (default
	// 1 MiB): a consumer of such records raises it.
	api := avro.Config{MaxByteSliceSize: 128 << 20}.Freeze()
	var serde sr.Serde
	serde.Register(ss.ID, blobRecord{}, sr.DecodeFn(func(b []byte, v any) error { return api.Unmarshal(schema, b, v) }))
	var dec blobRecord
	if err := serde.Decode(got.Value, &dec); err != nil {
		t.Fatalf("sr.Serde decode of what the proxy returned: %v", err)
	}
	if dec.ID != 100 || dec.Item != "large-100MiB" || !bytes.Equal(dec.Blob, got.Value[len(got.Value)-100<<20:]) {
		t.Fatalf("sr.Serde decoded id %d item %q, %d bytes", dec.ID, dec.Item, len(dec.Blob))
	}

	rss := p.peakRSS(t)
	bound := int64(512<<20 + 128<<20 + maxConns*(100<<10)) // docs/SECURITY.md
	t.Logf("proxy peak RSS %d MiB (bound %d MiB), budget in use now %.0f MiB", rss>>20, bound>>20,
		p.metric(t, "ferry_proxy_memory_bytes")/(1<<20))
	if rss > bound {
		t.Fatalf("proxy peak RSS %d MiB over the bound %d MiB", rss>>20, bound>>20)
	}
}

// validateSchemaSpec is validate-schema for topic (a pattern) against the
// registry at FERRY_SCHEMA_REGISTRY_URL.
func validateSchemaSpec(topic string) interceptor.Spec {
	return interceptor.Spec{Name: "validate-schema", Config: map[string]string{interceptor.KeyTopicPattern: topic,
		interceptor.KeySchemaRegistryURL: os.Getenv("FERRY_SCHEMA_REGISTRY_URL")}}
}

// What the chain's order means (docs/INTERCEPTORS.md): with validate-schema
// after large-message, a small record is validated as produced, but a
// large one reaches validate-schema as its reference, whose first byte (the
// reference's int16 version 0) reads as the magic byte and whose next four
// as a schema id the registry does not know: refused, and the object
// large-message had written is not left in the store. After encrypt, every
// sealed value starts with "FERRYENC": refused as unframed.
func TestValidateSchemaChainOrder(t *testing.T) {
	reg := schemaRegistry(t)
	storeURL := interceptorStoreURL(t)
	store := openStore(t, storeURL)
	topic := clientTopic(t, 1, nil)
	ss, err := reg.CreateSchema(ctxT(t, time.Minute), topic+"-value", sr.Schema{Schema: blobAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	small, large := framedBlob(ss.ID, 1, "small", 1, 1000), framedBlob(ss.ID, 2, "large", 2, 2<<20)
	answer := func(via string, value []byte) (int16, string) {
		p := produceAnswer(t, via, topic, value)
		msg := answerMessage(p)
		return p.ErrorCode, msg
	}

	via := interceptorProxy(t, 30*time.Second, largeMessageSpec(topic, storeURL), validateSchemaSpec(topic))
	if code, msg := answer(via, small); code != 0 {
		t.Fatalf("[large-message, validate-schema], a small valid record: code %d %s", code, msg)
	}
	code, msg := answer(via, large)
	if code != kerr.InvalidRecord.Code || !strings.Contains(msg, "schema id not registered under the subject") {
		t.Fatalf("[large-message, validate-schema], a 2 MiB valid record: code %d %q; want INVALID_RECORD, the reference's bytes read as an unknown id", code, msg)
	}
	t.Logf("[large-message, validate-schema], 2 MiB: %s", msg)
	if objs := objectsUnder(t, store, topic); len(objs) != 0 {
		t.Fatalf("objects left in the store after the refusal: %v", objs)
	}

	via = interceptorProxy(t, 30*time.Second, encryptSpec(topic, encryptKeyURL(t)), validateSchemaSpec(topic))
	code, msg = answer(via, small)
	if code != kerr.InvalidRecord.Code || !strings.Contains(msg, "not in the Confluent wire format") {
		t.Fatalf("[encrypt, validate-schema], a small valid record: code %d %q; want INVALID_RECORD, unframed", code, msg)
	}
	t.Logf("[encrypt, validate-schema]: %s", msg)
	if off := endOffset(t, topic); off != 1 {
		t.Fatalf("end offset %d, want 1: only the small record of the first chain", off)
	}
}
