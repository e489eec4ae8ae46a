package wasm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/wasm/abi"
)

// FuzzApplyOutput drives the host side of the ABI with arbitrary module
// output: decoding never panics and fails only with abi.ErrMalformed; what
// decodes applies to the records with one outcome per record, and the
// records keep nothing of the module's memory (the output bytes are
// overwritten after apply, as the module's next call would).
func FuzzApplyOutput(f *testing.F) {
	f.Add(abi.EncodeOutput(nil, []abi.Result{{Action: abi.Keep}, {Action: abi.Replace, Value: []byte("v"), Headers: []abi.Header{{Key: "h"}}},
		{Action: abi.Skip}, {Action: abi.Reject, Reason: "no"}}), uint8(4))
	f.Add([]byte{1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(1))
	f.Add([]byte{2, 0, 0, 0, 2, 3, 0, 0, 0, 0}, uint8(2))
	f.Fuzz(func(t *testing.T, out []byte, n uint8) {
		rs := recs(make([]string, n)...)
		res, err := abi.DecodeOutput(out, int(n))
		if err != nil {
			if !errors.Is(err, abi.ErrMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		errs := apply(rs, res)
		if errs != nil && len(errs) != int(n) {
			t.Fatalf("%d outcomes for %d records", len(errs), n)
		}
		snapshot := make([][]byte, 0, 2*len(rs))
		for i, r := range rs {
			e := error(nil)
			if errs != nil {
				e = errs[i]
			}
			switch res[i].Action {
			case abi.Skip:
				if !errors.Is(e, interceptor.ErrSkipRecord) {
					t.Fatalf("record %d: skip gave %v", i, e)
				}
			case abi.Reject:
				if !errors.Is(e, ErrRejected) || e.Error() != res[i].Reason {
					t.Fatalf("record %d: reject gave %v", i, e)
				}
			case abi.Replace:
				if e != nil || !bytes.Equal(r.Value, res[i].Value) || (r.Value == nil) != (res[i].Value == nil) || len(r.Headers) != len(res[i].Headers) {
					t.Fatalf("record %d: replace gave %v %q", i, e, r.Value)
				}
			}
			snapshot = append(snapshot, bytes.Clone(r.Key), bytes.Clone(r.Value))
		}
		for i := range out {
			out[i] ^= 0xff
		}
		for i, r := range rs {
			if !bytes.Equal(r.Key, snapshot[2*i]) || !bytes.Equal(r.Value, snapshot[2*i+1]) {
				t.Fatalf("record %d aliases the module's memory", i)
			}
		}
	})
}
