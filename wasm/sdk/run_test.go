package sdk

import (
	"bytes"
	"testing"

	"github.com/ferrykit/ferry/wasm/abi"
)

func batch(values ...string) []byte {
	b := &abi.Batch{Topic: "t", Partition: 2}
	for i, v := range values {
		b.Records = append(b.Records, abi.Record{Offset: int64(i), Timestamp: 7, Key: []byte("k"), Value: []byte(v),
			Headers: []abi.Header{{Key: "h", Value: []byte("x")}, {Key: "n"}}})
	}
	return abi.EncodeBatch(nil, b)
}

// run's output decoded, or nil for the fast path.
func results(t *testing.T, st *runner, fn Func, in []byte, n int) []abi.Result {
	t.Helper()
	out := st.run(fn, in)
	if out == nil {
		return nil
	}
	res, err := abi.DecodeOutput(bytes.Clone(out), n)
	if err != nil {
		t.Fatalf("output %x: %v", out, err)
	}
	return res
}

func TestRunUnchangedIsEmpty(t *testing.T) {
	var st runner
	seen := 0
	in := batch("a", "b", "c")
	// Reading, re-slicing to the same bytes, and re-assigning the same
	// headers change nothing.
	fn := func(r *Record) Result {
		seen++
		if r.Topic != "t" || r.Partition != 2 || r.Offset != int64(seen-1) || r.Timestamp != 7 {
			t.Errorf("record %+v", r)
		}
		r.Value = r.Value[:len(r.Value)]
		r.Headers = r.Headers[:]
		if v, ok := r.Header("h"); !ok || string(v) != "x" {
			t.Errorf("header h: %q %v", v, ok)
		}
		return Keep()
	}
	if res := results(t, &st, fn, in, 3); res != nil || seen != 3 {
		t.Fatalf("%d calls, results %+v; want 3 calls and the empty output", seen, res)
	}
	if st.run(nil, in) != nil {
		t.Fatal("no function: output not empty")
	}
}

func TestRunActions(t *testing.T) {
	var st runner
	fn := func(r *Record) Result {
		switch string(r.Value) {
		case "up":
			r.Value = bytes.ToUpper(r.Value)
		case "null":
			r.Value = nil
		case "empty-key":
			r.Key = []byte{}
		case "tag":
			r.SetHeader("h", []byte("y"))
			r.SetHeader("new", nil)
		case "rename":
			r.Headers[0].Key = "g" // the function's copy: the input is not changed
		case "skip":
			return Skip()
		case "reject":
			return Reject("too big")
		}
		return Keep()
	}
	in := batch("keep", "up", "null", "empty-key", "tag", "rename", "skip", "reject", "keep")
	res := results(t, &st, fn, in, 9)
	want := []abi.Action{abi.Keep, abi.Replace, abi.Replace, abi.Replace, abi.Replace, abi.Replace, abi.Skip, abi.Reject, abi.Keep}
	for i, a := range want {
		if res[i].Action != a {
			t.Fatalf("result %d: %v, want %v", i, res[i].Action, a)
		}
	}
	if string(res[1].Value) != "UP" || string(res[1].Key) != "k" || len(res[1].Headers) != 2 || res[1].Headers[1].Value != nil {
		t.Fatalf("up: %+v", res[1])
	}
	if res[2].Value != nil || res[3].Key == nil || len(res[3].Key) != 0 {
		t.Fatalf("null/empty: %+v %+v", res[2], res[3])
	}
	if h := res[4].Headers; len(h) != 3 || string(h[0].Value) != "y" || h[2].Key != "new" || h[2].Value != nil {
		t.Fatalf("tag: %+v", h)
	}
	if h := res[5].Headers; h[0].Key != "g" {
		t.Fatalf("rename: %+v", h)
	}
	if res[7].Reason != "too big" {
		t.Fatalf("reject: %+v", res[7])
	}
	// The input batch is unchanged by the functions (decoded again).
	b, err := abi.DecodeBatch(in)
	if err != nil || b.Records[5].Headers[0].Key != "h" {
		t.Fatalf("input changed: %v %+v", err, b.Records[5].Headers)
	}
	// The next call reuses the output buffer; a batch kept whole is empty.
	if res := results(t, &st, fn, batch("keep"), 1); res != nil {
		t.Fatalf("%+v", res)
	}
}

func TestRunMalformedPanics(t *testing.T) {
	var st runner
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("no panic")
		}
	}()
	st.run(func(*Record) Result { return Keep() }, []byte{1, 2})
}

func TestSetHeader(t *testing.T) {
	r := &Record{Headers: []Header{{Key: "a", Value: []byte("1")}, {Key: "b"}, {Key: "a", Value: []byte("2")}}}
	orig := r.Headers
	r.SetHeader("a", []byte("3"))
	if len(r.Headers) != 2 || string(r.Headers[0].Value) != "3" || r.Headers[1].Key != "b" || string(orig[0].Value) != "1" {
		t.Fatalf("%+v (input %+v)", r.Headers, orig)
	}
	if v, ok := r.Header("b"); !ok || v != nil {
		t.Fatal("b")
	}
	if _, ok := r.Header("c"); ok {
		t.Fatal("c")
	}
}

func TestInitModule(t *testing.T) {
	defer func() { initFn, produceFn, fetchFn = nil, nil, nil }()
	if msg := initModule(abi.EncodeConfig(map[string]string{"a": "1"})); msg != nil {
		t.Fatal(string(msg))
	}
	var got map[string]string
	OnInit(func(c map[string]string) error {
		got = c
		if c["side"] == "fetch" {
			OnFetch(func(*Record) Result { return Keep() })
		}
		if c["bad"] != "" {
			return errString("bad: " + c["bad"])
		}
		return nil
	})
	if msg := initModule(abi.EncodeConfig(map[string]string{"side": "fetch"})); msg != nil || got["side"] != "fetch" || sides() != sideFetch {
		t.Fatalf("%s %v %d", msg, got, sides())
	}
	if msg := initModule(abi.EncodeConfig(map[string]string{"bad": "x"})); string(msg) != "bad: x" {
		t.Fatalf("%q", msg)
	}
	if msg := initModule([]byte{9}); !bytes.Contains(msg, []byte("ABI v1")) {
		t.Fatalf("%q", msg)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
