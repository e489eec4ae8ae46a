package schemareg

import (
	"context"
	"errors"
	"testing"

	"github.com/hamba/avro/v2"
)

// FuzzSchemaDecode parses a hostile schema of each type (kind % 3: Avro,
// JSON Schema, Protobuf) and checks a hostile framed payload under it: no
// panic, no hang, and every failure is one of the package's errors.
func FuzzSchemaDecode(f *testing.F) {
	as, _ := parseAvro(testAvroSchema, nil)
	good, _ := avro.Marshal(as.s, testAvroValue())
	f.Add(uint8(0), testAvroSchema, AppendFrame(nil, 1, nil, good))
	f.Add(uint8(0), `{"type":"record","name":"L","fields":[{"name":"n","type":["null","L"]}]}`, AppendFrame(nil, 1, nil, []byte{2, 2, 0}))
	f.Add(uint8(0), `{"type":"array","items":{"type":"map","values":"null"}}`, AppendFrame(nil, 1, nil, []byte{3, 2, 0}))
	f.Add(uint8(1), testJSONSchema, AppendFrame(nil, 1, nil, []byte(`{"id":1}`)))
	f.Add(uint8(2), testProto, AppendFrame(nil, 1, []int{0}, []byte{0x08, 0x2a}))
	f.Add(uint8(2), testProto, AppendFrame(nil, 1, []int{0, 0}, []byte{0x08, 0x01}))
	f.Fuzz(func(t *testing.T, kind uint8, schema string, b []byte) {
		if len(schema) > 4096 {
			return
		}
		ctx := context.Background()
		lim := Limits{MaxDepth: 64, MaxItems: 10000, MaxMessages: 10000}
		var err error
		switch kind % 3 {
		case 0:
			var s *avroSchema
			if s, err = parseAvro(schema, nil); err == nil {
				var fr Frame
				if fr, err = ParseFrame(b, false); err == nil {
					_, err = (&parsedSchema{avro: s}).decode(ctx, fr, lim)
				}
			}
		case 1:
			var s *jsonSchema
			if s, err = parseJSONSchema(1, schema, nil, lim); err == nil {
				var fr Frame
				if fr, err = ParseFrame(b, false); err == nil {
					_, err = (&parsedSchema{json: s}).decode(ctx, fr, lim)
				}
			}
		case 2:
			var s *protoSchema
			if s, err = parseProtobuf(ctx, schema, nil); err == nil {
				var fr Frame
				if fr, err = ParseFrame(b, true); err == nil {
					if _, err = s.recordName(fr.Indexes); err == nil {
						_, err = (&parsedSchema{proto: s}).decode(ctx, fr, lim)
					}
				}
			}
		}
		if err != nil && !errors.Is(err, ErrBadSchema) && !errors.Is(err, ErrNotFramed) && !errors.Is(err, ErrInvalidPayload) {
			t.Fatalf("kind %d: error %v wraps none of the package's errors", kind%3, err)
		}
	})
}
