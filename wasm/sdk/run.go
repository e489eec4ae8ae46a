package sdk

import (
	"encoding/binary"
	"fmt"

	"github.com/ferrykit/ferry/wasm/abi"
)

// runner holds what one call needs, reused from call to call (calls into
// an instance never overlap).
type runner struct {
	rec  Record
	hdrs []Header      // the function's copy of the input headers
	one  [1]abi.Result // the result being encoded
	out  []byte        // the output batch; the host reads it after the call
}

// keepBufBytes is the capacity above which a buffer is dropped after a
// call that used less than a quarter of it, so one large batch does not
// pin its size for the instance's life.
const keepBufBytes = 1 << 20

// run applies fn to every record of the input batch in and returns the
// output batch, or nil when every record is kept unchanged (the host's
// fast path: nothing is encoded until the first record that changes).
// Input the host should never send panics (the call fails with the
// message in the proxy's log).
func (st *runner) run(fn Func, in []byte) []byte {
	if fn == nil {
		return nil
	}
	b, err := abi.DecodeBatch(in)
	if err != nil {
		panic(fmt.Sprintf("ferry wasm sdk: the input batch does not follow ABI v1: %v", err))
	}
	if cap(st.out) > keepBufBytes && len(st.out) < cap(st.out)/4 {
		st.out = nil
	}
	st.out = st.out[:0]
	changed := false
	for i := range b.Records {
		src := &b.Records[i]
		r := &st.rec
		st.hdrs = append(st.hdrs[:0], src.Headers...)
		*r = Record{Topic: b.Topic, Partition: b.Partition, Offset: src.Offset, Timestamp: src.Timestamp,
			Key: src.Key, Value: src.Value, Headers: st.hdrs[:len(st.hdrs):len(st.hdrs)]}
		if len(src.Headers) == 0 {
			r.Headers = nil
		}
		res := fn(r)
		action := res.action
		if action == abi.Keep && !unchanged(r, src) {
			action = abi.Replace
		}
		if action == abi.Keep && !changed {
			continue
		}
		if !changed {
			// The first record that is not kept: the records before it are.
			changed = true
			st.out = binary.LittleEndian.AppendUint32(st.out, uint32(len(b.Records)))
			for range i {
				st.out = append(st.out, byte(abi.Keep))
			}
		}
		st.one[0] = abi.Result{Action: action, Reason: res.reason}
		if action == abi.Replace {
			st.one[0].Key, st.one[0].Value, st.one[0].Headers = r.Key, r.Value, r.Headers
		}
		st.appendResult()
	}
	*st = runner{hdrs: st.hdrs[:0], out: st.out} // drop references to the input
	if !changed {
		return nil
	}
	return st.out
}

// appendResult appends st.one[0]'s encoding to st.out: abi.EncodeOutput's
// (the one codec), without its record count.
func (st *runner) appendResult() {
	at := len(st.out)
	st.out = abi.EncodeOutput(st.out, st.one[:])
	n := copy(st.out[at:], st.out[at+4:])
	st.out = st.out[:at+n]
	st.one[0] = abi.Result{}
}

// unchanged reports whether r still holds src's key, value and headers
// (the same slices: the function assigned nothing new).
func unchanged(r *Record, src *abi.Record) bool {
	if !sameBytes(r.Key, src.Key) || !sameBytes(r.Value, src.Value) || len(r.Headers) != len(src.Headers) {
		return false
	}
	for i := range r.Headers {
		if r.Headers[i].Key != src.Headers[i].Key || !sameBytes(r.Headers[i].Value, src.Headers[i].Value) {
			return false
		}
	}
	return true
}

// sameBytes reports whether a and b are the same slice of the same
// memory, or both null, or both empty and not null.
func sameBytes(a, b []byte) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}

// initModule runs the OnInit function on ferry_init's input and returns
// nil, or the error message that refuses the module.
func initModule(in []byte) []byte {
	config, err := abi.DecodeConfig(in)
	if err != nil {
		return []byte(fmt.Sprintf("ferry wasm sdk: the configuration does not follow ABI v1: %v", err))
	}
	if initFn == nil {
		return nil
	}
	if err := initFn(config); err != nil {
		msg := err.Error()
		if msg == "" {
			msg = "init failed"
		}
		return []byte(msg)
	}
	return nil
}
