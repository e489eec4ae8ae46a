package schemareg

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const avroJSONSchema = `{"type":"record","name":"All","namespace":"dev.ferry.test","fields":[
 {"name":"b","type":"boolean"},{"name":"i","type":"int"},{"name":"l","type":"long"},
 {"name":"f","type":"float"},{"name":"d","type":"double"},{"name":"s","type":"string"},
 {"name":"y","type":"bytes"},{"name":"x","type":{"type":"fixed","name":"F","size":2}},
 {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},
 {"name":"a","type":{"type":"array","items":"long"}},{"name":"m","type":{"type":"map","values":"string"}},
 {"name":"u","type":["null","string","dev.ferry.test.F"]},{"name":"n","type":["null","long"]},
 {"name":"r","type":{"type":"record","name":"Inner","fields":[{"name":"k","type":"int"}]}},
 {"name":"def","type":"int","default":7}]}`

// Avro's JSON encoding in (as kafka-avro-console-producer reads it) gives
// the same JSON out (as kafka-avro-console-consumer prints it), through
// hamba/avro's binary encoding and generic values; hostile or mistyped JSON
// gets ErrInvalidPayload naming the field.
func TestAvroJSONRoundTrip(t *testing.T) {
	a, err := parseAvro(avroJSONSchema, nil)
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{MaxDepth: 50, MaxItems: 1000}
	in := `{"b":true,"i":-5,"l":9007199254740993,"f":1.5,"d":-2.25,"s":"héllo","y":"\u0000\u00ffA","x":"\u0001\u0002",` +
		`"e":"B","a":[1,2,3],"m":{"k":"v"},"u":{"string":"w"},"n":null,"r":{"k":3}}`
	v, err := a.fromJSON([]byte(in), lim)
	if err != nil {
		t.Fatal(err)
	}
	b, err := avroAPI.Marshal(a.s, v)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.validate(t.Context(), b, lim); err != nil {
		t.Fatal(err)
	}
	out, err := (&parsedSchema{avro: a}).decode(t.Context(), Frame{Payload: b}, lim)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(AvroJSON(out))
	if err != nil {
		t.Fatal(err)
	}
	var want, have map[string]any
	d := json.NewDecoder(strings.NewReader(in))
	d.UseNumber()
	_ = d.Decode(&want)
	want["def"] = json.Number("7") // the default, written by the encoder
	d = json.NewDecoder(strings.NewReader(string(got)))
	d.UseNumber()
	_ = d.Decode(&have)
	if !reflect.DeepEqual(want, have) {
		t.Fatalf("round trip:\n in  %v\n out %v", want, have)
	}

	for _, tc := range []struct{ json, want string }{
		{`{"b":1}`, ".b: want true or false"},
		{`{"i":2147483648}`, ".i: 2147483648 is out of an int's range"},
		{`{"l":1.5}`, ".l: 1.5 is not an integer"},
		{`{"y":"\u0100"}`, ".y: code point U+0100"},
		{`{"u":"w"}`, `.u: want null or {"<type>": value}`},
		{`{"u":{"int":1}}`, `.u: the union has no branch "int"`},
		{`{"a":[1,"x"]}`, ".a[1]: want an integer"},
		{`{"r":[]}`, ".r: want an object"},
		{`[` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 100) + `]`, "deeper"},
		{`{"b":true,"b":false}`, "duplicate"},
		{`{"b":true} x`, ""},
	} {
		_, err := a.fromJSON([]byte(tc.json), lim)
		if !errors.Is(err, ErrInvalidPayload) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.json, err, tc.want)
		}
	}
}

// What ferry consume prints is read back by ferry produce: a union of null
// and one type (hamba/avro decodes one with a primitive branch to its plain
// value, one with a named branch wrapped), timestamps and dates (RFC 3339).
func TestAvroJSONPrintedFormReadsBack(t *testing.T) {
	a, err := parseAvro(`{"type":"record","name":"P","fields":[{"name":"n","type":["null","string"]},`+
		`{"name":"r","type":["null",{"type":"record","name":"Q","fields":[{"name":"k","type":"long"}]}]},`+
		`{"name":"t","type":{"type":"long","logicalType":"timestamp-millis"}},{"name":"d","type":{"type":"int","logicalType":"date"}}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{MaxDepth: 50, MaxItems: 1000}
	for _, in := range []string{
		`{"n":"x","r":{"k":3},"t":"2023-11-14T22:13:20.5Z","d":"2023-11-14T00:00:00Z"}`,
		`{"n":{"string":"x"},"r":{"Q":{"k":3}},"t":"2023-11-14T22:13:20.5Z","d":"2023-11-14"}`,
	} {
		v, err := a.fromJSON([]byte(in), lim)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		b, err := avroAPI.Marshal(a.s, v)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		out, err := (&parsedSchema{avro: a}).decode(t.Context(), Frame{Payload: b}, lim)
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(AvroJSON(out))
		if want := `{"d":"2023-11-14T00:00:00Z","n":"x","r":{"Q":{"k":3}},"t":"2023-11-14T22:13:20.5Z"}`; err != nil || string(got) != want {
			t.Fatalf("%s printed as %s (%v), want %s", in, got, err, want)
		}
	}
}
