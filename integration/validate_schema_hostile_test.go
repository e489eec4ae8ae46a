package integration

// Hostile schema-framed records against the real registry and broker: a
// client sends them through `ferry proxy` with validate-schema and rules,
// or another producer writes them straight to Kafka for the Go library's
// Deserializer to read.

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/ferrykit/ferry/internal/schemareg"
	"github.com/ferrykit/ferry/serde"
)

// Five bytes framed under an array of empty records, claiming 9 million
// of them: the proxy with a rule refuses the record (INVALID_RECORD, "take
// no bytes") instead of decoding gigabytes, and keeps serving; a JSON id
// beyond 2^53 meets a rule exactly; the library's Deserializer reading the
// same 5 bytes from Kafka returns a typed error without building them.
func TestValidateSchemaHostileRecords(t *testing.T) {
	reg := schemaRegistry(t)
	url := os.Getenv("FERRY_SCHEMA_REGISTRY_URL")
	topic := "orders-hostile-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	arr, err := reg.CreateSchema(ctxT(t, time.Minute), topic+"-value",
		sr.Schema{Schema: `{"type":"array","items":{"type":"record","name":"Empty","fields":[]}}`, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	jsonTopic := topic + "-json"
	js, err := reg.CreateSchema(ctxT(t, time.Minute), jsonTopic+"-value", sr.Schema{Schema: `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"id":{"type":"integer"}}}`, Type: sr.TypeJSON})
	if err != nil {
		t.Fatal(err)
	}
	base := ordersTopic(t, topic)
	jsonBase := ordersTopic(t, jsonTopic)
	via := validateSchemaProxy(t, url, "validate.schema.rule.not-blocked=!topic.endsWith('-json') || value.id != 1234567890123456789")
	hostile := schemareg.AppendFrame(nil, arr.ID, nil, append(binary.AppendVarint(nil, 9_000_000), 0))
	refused := func(value []byte, topic, want string) {
		t.Helper()
		p := produceAnswer(t, via, topic, value)
		msg := answerMessage(p)
		if p.ErrorCode != kerr.InvalidRecord.Code || !strings.Contains(msg, want) {
			t.Fatalf("code %d, message %q; want INVALID_RECORD naming %q", p.ErrorCode, msg, want)
		}
	}
	refused(hostile, topic, "take no bytes")
	if p := produceAnswer(t, via, topic, schemareg.AppendFrame(nil, arr.ID, nil, []byte{4, 0})); p.ErrorCode != 0 {
		t.Fatalf("two empty records after the hostile one: code %d", p.ErrorCode)
	}
	refused(schemareg.AppendFrame(nil, js.ID, nil, []byte(`{"id":1234567890123456789}`)), jsonTopic, "rule not-blocked")
	if p := produceAnswer(t, via, jsonTopic, schemareg.AppendFrame(nil, js.ID, nil, []byte(`{"id":1234567890123456788}`))); p.ErrorCode != 0 {
		t.Fatalf("the blocked id's neighbour: code %d", p.ErrorCode)
	}
	if off := endOffset(t, topic); off != base+1 {
		t.Fatalf("end offset %d, want %d", off, base+1)
	}
	if off := endOffset(t, jsonTopic); off != jsonBase+1 {
		t.Fatalf("JSON end offset %d, want %d", off, jsonBase+1)
	}

	// Another producer writes the hostile bytes straight to the broker.
	if err := client(t).ProduceSync(ctxT(t, time.Minute), &kgo.Record{Topic: topic, Value: hostile}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	_, cons := schemaChain(t, "avro", "avro", nil)
	recs := consumeRaw(t, topic, 2)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	_, _, err = cons.Decode(ctxT(t, time.Minute), cons.Resolve(ctxT(t, time.Minute), recs[1:])[0])
	runtime.ReadMemStats(&m1)
	if !errors.Is(err, serde.ErrSchema) || !strings.Contains(err.Error(), "take no bytes") {
		t.Fatalf("the Deserializer on 9M empty records in 5 bytes: %v", err)
	}
	if grew := m1.TotalAlloc - m0.TotalAlloc; grew > 16<<20 {
		t.Errorf("the Deserializer allocated %d bytes refusing a 10-byte record", grew)
	}
}
