package interceptor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// inlineIcpt is a test interceptor that says it is an inliner, as the
// built-ins encrypt, redact and validate-json do.
type inlineIcpt struct{ *funcIcpt }

func (inlineIcpt) inline() bool { return true }

// goid returns the calling goroutine's id, from its stack's first line.
func goid() string {
	var b [64]byte
	line := b[:runtime.Stack(b[:], false)]
	line = bytes.TrimPrefix(line, []byte("goroutine "))
	return string(line[:bytes.IndexByte(line, ' ')])
}

// A small partition that only inliners see runs on the request's
// goroutine; a larger one, or one a non-inliner also sees, in a goroutine
// of its own (runPart). Either way the records are processed.
func TestInlineRunsOnRequestGoroutine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inline bool
		value  int
		want   bool
	}{
		{"inliner small", true, 10, true},
		{"inliner at the bound", true, inlineMaxBytes - 200, true},
		{"inliner over the bound", true, inlineMaxBytes + 1, false},
		{"not an inliner", false, 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var where atomic.Value
			fn := func(_ context.Context, r *Record) error {
				where.Store(goid())
				r.Value = append([]byte("x"), r.Value...)
				return nil
			}
			var ic ProduceRequestInterceptor = icpt(t, "ic", ".*", fn)
			if tc.inline {
				ic = inlineIcpt{icpt(t, "ic", ".*", fn)}
			}
			ch := NewChain([]Instance{{Produce: ic}}, Options{})
			batch := plainBatch(t, 0, -1, strings.Repeat("v", tc.value))
			if tc.inline && tc.value > 10 && (len(batch) > inlineMaxBytes) != !tc.want {
				t.Fatalf("batch of %d bytes is on the wrong side of inlineMaxBytes", len(batch))
			}
			req := buildRequest(t, map[string][]byte{"t": batch})
			out := ch.InterceptProduce(context.Background(), req, nil)
			defer out.Release()
			if len(out.Answered) != 0 || out.Rewritten != 1 {
				t.Fatalf("answered %+v, rewritten %d", out.Answered, out.Rewritten)
			}
			if got := where.Load() == goid(); got != tc.want {
				t.Fatalf("ran on the request's goroutine: %v, want %v", got, tc.want)
			}
		})
	}
}

// An inliner's call that runs over the budget has its ctx cancelled by the
// timer and fails its partition with REQUEST_TIMED_OUT, naming the call,
// when it returns; on fetch KAFKA_STORAGE_ERROR. Its memory is given back.
func TestInlineTimeoutFailsPartition(t *testing.T) {
	stuck := func(ctx context.Context, r *Record) error {
		if err := r.Reserve(ctx, 1<<10); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	ch := NewChain([]Instance{{Produce: inlineIcpt{icpt(t, "stuck", "slow", stuck)}}}, Options{Timeout: 50e6})
	req := buildRequest(t, map[string][]byte{"slow": plainBatch(t, 0, -1, "a"), "fast": plainBatch(t, 0, -1, "b")})
	out := ch.InterceptProduce(context.Background(), req, nil)
	if len(out.Answered) != 1 || out.Answered[0].Topic != "slow" || out.Answered[0].ErrorCode != kerr.RequestTimedOut.Code ||
		!strings.Contains(out.Answered[0].ErrorMessage, "stuck ran over "+KeyTimeout+"=50 on record 0") {
		t.Fatalf("outcome %+v", out)
	}
	if !out.Forward || len(req.Topics) != 1 || req.Topics[0].Topic != "fast" {
		t.Fatalf("request left %+v", req.Topics)
	}
	out.Release()
	if used := ch.Memory().InUse(); used != 0 {
		t.Fatalf("%d bytes of the budget still charged", used)
	}
	fch := NewChain([]Instance{{Fetch: inlineIcpt{icpt(t, "stuck", "slow", stuck)}}}, Options{Timeout: 50e6})
	resp := fetchResponse(map[string][]byte{"slow": plainBatch(t, 0, -1, "a")})
	fo := fch.InterceptFetch(context.Background(), resp)
	if p := resp.Topics[0].Partitions[0]; p.ErrorCode != kerr.KafkaStorageError.Code || p.RecordBatches == nil || len(p.RecordBatches) != 0 ||
		len(fo.Failed) != 1 || !strings.Contains(fo.Failed[0].Err.Error(), "stuck ran over") {
		t.Fatalf("fetch partition %+v outcome %+v", p, fo)
	}
	fo.Release()
}

// An inliner's panic fails only its partition (UNKNOWN_SERVER_ERROR); a
// request whose client went away stops its inliners' work.
func TestInlinePanicAndClientGone(t *testing.T) {
	ch := NewChain([]Instance{{Produce: inlineIcpt{icpt(t, "boom", ".*", func(_ context.Context, r *Record) error {
		if string(r.Value) == "boom" {
			panic("interceptor bug")
		}
		return nil
	})}}}, Options{})
	req := buildRequest(t, map[string][]byte{"a": plainBatch(t, 0, -1, "boom"), "b": plainBatch(t, 0, -1, "fine")})
	out := ch.InterceptProduce(context.Background(), req, nil)
	if len(out.Answered) != 1 || out.Answered[0].Topic != "a" || out.Answered[0].ErrorCode != kerr.UnknownServerError.Code ||
		!strings.Contains(out.Answered[0].ErrorMessage, "interceptor bug") {
		t.Fatalf("answered %+v", out.Answered)
	}
	if !out.Forward || len(req.Topics) != 1 || req.Topics[0].Topic != "b" {
		t.Fatalf("the healthy partition was not forwarded: %+v", req.Topics)
	}
	out.Release()

	ctx, cancel := context.WithCancel(context.Background())
	gone := NewChain([]Instance{{Produce: inlineIcpt{icpt(t, "waits", ".*", func(ctx context.Context, r *Record) error {
		cancel() // the client goes away during the call
		<-ctx.Done()
		return ctx.Err()
	})}}}, Options{})
	req = buildRequest(t, map[string][]byte{"a": plainBatch(t, 0, -1, "v")})
	out = gone.InterceptProduce(ctx, req, nil)
	if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.RequestTimedOut.Code ||
		!strings.Contains(out.Answered[0].ErrorMessage, "interceptors stopped") {
		t.Fatalf("answered %+v", out.Answered)
	}
	out.Release()
	if used := gone.Memory().InUse(); used != 0 {
		t.Fatalf("%d bytes of the budget still charged", used)
	}
}

// Once a partition's output is a copy, each batch rewritten after it is
// encoded at the output's end (decodedBatch.into), compressed or not; the
// batches passed between them are copied there, and a record that fails
// ends the output after the records before it. Checked batch by batch
// (CRC-32C, lengths, counts) and by franz-go's own fetch processing.
//
// Inliners' partitions are built in pooled buffers, given back by Release:
// the package's tests poison what is given back, so the output reads as
// poison afterwards.
func TestFetchRewrittenBatchesAppendedInPlace(t *testing.T) {
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprint("inline=", inline), func(t *testing.T) { testFetchAppendedInPlace(t, inline) })
	}
}

func testFetchAppendedInPlace(t *testing.T, inline bool) {
	batch := func(first int64, attrs int16, vals ...string) []byte {
		b := plainBatch(t, attrs, -1, vals...)
		binary.BigEndian.PutUint64(b, uint64(first))
		binary.BigEndian.PutUint32(b[crcOffset:], crc32.Checksum(b[attrOffset:], castagnoli))
		return b
	}
	var ic FetchResponseInterceptor = icpt(t, "upper", "t", func(_ context.Context, r *Record) error {
		switch {
		case string(r.Value) == "fail":
			return errTest
		case bytes.HasPrefix(r.Value, []byte("x")):
			r.Value = bytes.ToUpper(bytes.Repeat(r.Value, 500))
		}
		return nil
	})
	if inline {
		ic = inlineIcpt{ic.(*funcIcpt)}
	}
	ch := NewChain([]Instance{{Fetch: ic}}, Options{})
	for _, tc := range []struct {
		layout []string // a batch's value prefix: "x" rewritten, "a" passed
		fail   bool     // the last batch's second record fails
	}{
		{layout: []string{"x", "x", "x", "x"}},
		{layout: []string{"a", "x", "a", "x", "x", "a"}},
		{layout: []string{"x", "a", "x", "x"}, fail: true},
	} {
		var set []byte
		var want []string
		for i, v := range tc.layout {
			attrs := []int16{0, 3, 4, 0}[i%4] // none, lz4, zstd
			vals := []string{v + fmt.Sprint(i, "-0"), v + fmt.Sprint(i, "-1")}
			if tc.fail && i == len(tc.layout)-1 {
				vals[1] = "fail"
			}
			set = append(set, batch(int64(i*2), attrs, vals...)...)
			for j, val := range vals {
				if tc.fail && i == len(tc.layout)-1 && j == 1 {
					break
				}
				if v == "x" {
					val = strings.ToUpper(strings.Repeat(val, 500))
				}
				want = append(want, val)
			}
		}
		orig := bytes.Clone(set)
		resp := fetchResponse(map[string][]byte{"t": set})
		out := ch.InterceptFetch(context.Background(), resp)
		if tc.fail != (len(out.Failed) == 1 && out.Failed[0].Partial) || !tc.fail && len(out.Failed) != 0 {
			t.Fatalf("%v: failed %+v", tc.layout, out.Failed)
		}
		if !bytes.Equal(set, orig) {
			t.Fatalf("%v: the broker's bytes were written over", tc.layout)
		}
		p := &resp.Topics[0].Partitions[0]
		checkBatches(t, p.RecordBatches)
		var got []string
		for _, r := range records(t, "t", p) {
			got = append(got, string(r.Value))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%v: values\n%q\nwant\n%q", tc.layout, got, want)
		}
		out.Release()
		if poisoned := bytes.Count(p.RecordBatches, []byte{0xdb}) == len(p.RecordBatches); poisoned != inline {
			t.Fatalf("%v: output given back to the pool: %v, want %v", tc.layout, poisoned, inline)
		}
	}
}

// Which built-ins are inliners: encrypt, redact, and validate-json without
// a schema. A JSON Schema's validation ignores ctx and can take
// exponential time on a small value (a recursive oneOf over nested arrays:
// found by a fault-finding run, 1 min 22 s against a 100 ms budget when
// it ran inline), so validate-json with a schema keeps a goroutine of its
// own and fails the partition at the budget; validate-schema asks a
// registry.
func TestInlinersAmongBuiltins(t *testing.T) {
	schema := `{"$ref":"#/$defs/t","$defs":{"t":{"oneOf":[{"type":"array","items":{"$ref":"#/$defs/t"}},{"type":"array","items":{"$ref":"#/$defs/t"},"maxItems":5}]}}}`
	for _, tc := range []struct {
		name   string
		config map[string]string
		inline bool
	}{
		{"encrypt", map[string]string{KeyEncryptKeyURL: encKeyURL(t)}, true},
		{"redact", map[string]string{KeyRedactFields: "a"}, true},
		{"validate-json", map[string]string{}, true},
		{"validate-json", map[string]string{KeyJSONSchema: schema}, false},
	} {
		tc.config[KeyTopicPattern] = "j"
		ch := NewChain([]Instance{newBuiltin(t, tc.name, tc.config)}, Options{Timeout: 100e6})
		ps, _ := ch.produceProcs("j")
		if len(ps) != 1 || ps[0].inline != tc.inline {
			t.Fatalf("%s %v: procs %+v, want inline %v", tc.name, tc.config, ps, tc.inline)
		}
		if tc.inline {
			continue
		}
		depth := 18 // about 2 s of validation
		val := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		req := buildRequest(t, map[string][]byte{"j": plainBatch(t, 0, -1, val)})
		out := ch.InterceptProduce(context.Background(), req, nil)
		if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.RequestTimedOut.Code ||
			!strings.Contains(out.Answered[0].ErrorMessage, "validate-json ran over") {
			t.Fatalf("answered %+v", out.Answered)
		}
		out.Release()
	}
}

// A Produce partition only inliners see has its rewritten batch encoded
// into a pooled buffer, given back by Release (poisoned in the package's
// tests); the same with a non-inliner is its own allocation, kept.
func TestProducePooledBatches(t *testing.T) {
	for _, inline := range []bool{false, true} {
		fn := func(_ context.Context, r *Record) error {
			r.Value = bytes.Repeat(r.Value, 3)
			return nil
		}
		var ic ProduceRequestInterceptor = icpt(t, "grow", ".*", fn)
		if inline {
			ic = inlineIcpt{icpt(t, "grow", ".*", fn)}
		}
		ch := NewChain([]Instance{{Produce: ic}}, Options{})
		val := strings.Repeat("v", 3000)
		req := buildRequest(t, map[string][]byte{"t": plainBatch(t, 0, -1, val, val)})
		out := ch.InterceptProduce(context.Background(), req, nil)
		recs := req.Topics[0].Partitions[0].Records
		if out.Rewritten != 1 || len(out.Answered) != 0 {
			t.Fatalf("inline %v: rewritten %d answered %+v", inline, out.Rewritten, out.Answered)
		}
		checkBatches(t, recs)
		d, err := decodeBatch(context.Background(), nil, recs)
		if err != nil || len(d.recs) != 2 || string(d.recs[1].Value) != strings.Repeat(val, 3) {
			t.Fatalf("inline %v: batch %v, %v", inline, d, err)
		}
		out.Release()
		if poisoned := bytes.Count(recs, []byte{0xdb}) == len(recs); poisoned != inline {
			t.Fatalf("inline %v: batch given back to the pool: %v", inline, poisoned)
		}
		if used := ch.Memory().InUse(); used != 0 {
			t.Fatalf("inline %v: %d bytes still charged", inline, used)
		}
	}
}

// HoldsRequest is false only when nothing the outcome keeps can read the
// request's bytes: every partition forwarded and no deferred work. A
// partition answered (refused by an interceptor, or over the time budget
// with its call still running) or a record with deferred work holds them.
func TestProduceHoldsRequest(t *testing.T) {
	grow := func(_ context.Context, r *Record) error {
		r.Value = append(r.Value, '!')
		return nil
	}
	refuse := func(_ context.Context, r *Record) error {
		if string(r.Value) == "bad" {
			return errors.New("refused")
		}
		return nil
	}
	deferred := func(_ context.Context, r *Record) error {
		r.Defer(&abortCounter{})
		return nil
	}
	release := make(chan struct{})
	defer close(release)
	slow := func(ctx context.Context, r *Record) error {
		if string(r.Value) == "slow" {
			<-release // runs on past the budget, on the request's bytes
		}
		return nil
	}
	for _, tc := range []struct {
		name   string
		ic     ProduceRequestInterceptor
		second string // the value of the second partition's record
		holds  bool
	}{
		{"rewritten by an inliner", inlineIcpt{icpt(t, "grow", ".*", grow)}, "ok", false},
		{"rewritten in a goroutine", icpt(t, "grow", ".*", grow), "ok", false},
		{"a partition refused", icpt(t, "refuse", ".*", refuse), "bad", true},
		{"deferred work", icpt(t, "defer", ".*", deferred), "ok", true},
		{"a call over the budget", icpt(t, "slow", ".*", slow), "slow", true},
	} {
		// The budget: short where a call is meant to run over it, ample
		// elsewhere, so a loaded machine does not make a call overrun.
		budget := 10 * time.Second
		if tc.second == "slow" {
			budget = 100 * time.Millisecond
		}
		ch := NewChain([]Instance{{Produce: tc.ic}}, Options{Timeout: budget})
		req := buildRequest(t, map[string][]byte{"a": plainBatch(t, 0, -1, "ok"), "b": plainBatch(t, 0, -1, tc.second)})
		out := ch.InterceptProduce(context.Background(), req, nil)
		if got := out.HoldsRequest(); got != tc.holds {
			t.Errorf("%s: HoldsRequest %v (answered %+v), want %v", tc.name, got, out.Answered, tc.holds)
		}
		out.Release()
	}
}

// A fetch whose every batch an inliner rewrites, its records shrinking (as
// encrypt's opened values do), is encoded into the one buffer reserved for
// the partition at its first rewritten batch: no copy into a larger one
// once the output passes half of it.
func TestFetchRewrittenPartitionOneBuffer(t *testing.T) {
	shrink := inlineIcpt{icpt(t, "shrink", "t", func(_ context.Context, r *Record) error {
		r.Value = r.Value[:900]
		return nil
	})}
	ch := NewChain([]Instance{{Fetch: shrink}}, Options{})
	val := strings.Repeat("v", 1000)
	var set []byte
	for i := range 40 {
		b := plainBatch(t, 0, -1, val, val, val, val)
		binary.BigEndian.PutUint64(b, uint64(i*4))
		binary.BigEndian.PutUint32(b[crcOffset:], crc32.Checksum(b[attrOffset:], castagnoli))
		set = append(set, b...)
	}
	resp := fetchResponse(map[string][]byte{"t": set})
	out := ch.InterceptFetch(context.Background(), resp)
	defer out.Release()
	p := &resp.Topics[0].Partitions[0]
	if len(out.Failed) != 0 || out.Rewritten != 1 {
		t.Fatalf("failed %+v, rewritten %d", out.Failed, out.Rewritten)
	}
	checkBatches(t, p.RecordBatches)
	if n := len(records(t, "t", p)); n != 160 {
		t.Fatalf("%d records", n)
	}
	if _, capacity, _ := outClass(len(set)); cap(p.RecordBatches) > capacity {
		t.Fatalf("output of %d bytes in a buffer of %d: grown past the %d reserved for the partition's %d bytes",
			len(p.RecordBatches), cap(p.RecordBatches), capacity, len(set))
	}
}

// encrypt with a hashivault:// key is no inliner: gocloud.dev's Vault
// keeper does not pass ctx on, so a Vault that never answers would hold
// the request's goroutine past the time budget (and a proxy's shutdown
// with it; found by a helper). Its partition runs in a goroutine of its
// own: the request gets REQUEST_TIMED_OUT within the budget, and the
// fetch half likewise. Other key URLs stay inliners.
func TestEncryptVaultNotInline(t *testing.T) {
	addr := silentVault.start(t)
	t.Cleanup(silentVault.hangUp) // the abandoned calls end when their connections do
	// gocloud.dev's hashivault opener reads the address once per process:
	// the server is the same for every run of the test (-count).
	t.Setenv("VAULT_SERVER_URL", "http://"+addr)
	t.Setenv("VAULT_SERVER_TOKEN", "test")
	ctx := context.Background()
	vault, err := New(ctx, "encrypt", map[string]string{KeyEncryptKeyURL: "hashivault://ferry-test"})
	if err != nil {
		t.Fatal(err)
	}
	local, err := New(ctx, "encrypt", map[string]string{KeyEncryptKeyURL: encKeyURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	decryptVault, err := New(ctx, "encrypt", map[string]string{KeyEncryptKeyURL: encKeyURL(t), KeyEncryptDecryptKeyURLs: "hashivault://old"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   Instance
		want bool
	}{{"hashivault", vault, false}, {"base64key", local, true}, {"base64key, hashivault to decrypt", decryptVault, false}} {
		if got := inlineOf(tc.in.Produce); got != tc.want {
			t.Errorf("%s: produce half inliner %v, want %v", tc.name, got, tc.want)
		}
		if got := inlineOf(tc.in.Fetch); got != tc.want {
			t.Errorf("%s: fetch half inliner %v, want %v", tc.name, got, tc.want)
		}
	}
	const budget = 300 * time.Millisecond
	ch := NewChain([]Instance{vault}, Options{Timeout: budget})
	req := buildRequest(t, map[string][]byte{"t": plainBatch(t, 0, -1, "a")})
	start := time.Now()
	out := ch.InterceptProduce(ctx, req, nil)
	took := time.Since(start)
	if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.RequestTimedOut.Code {
		t.Fatalf("outcome %+v", out)
	}
	// Well within the Vault client's own 60 s timeout: the budget ended it.
	if took > 30*time.Second {
		t.Fatalf("the request took %s with a %s budget", took, budget)
	}
	out.Release()
}

// silentVault accepts connections and never answers: a Vault that hangs.
var silentVault hangingServer

type hangingServer struct {
	once sync.Once
	addr string
	err  error
	mu   sync.Mutex
	held []net.Conn
}

// start starts it once per test process and returns its address.
func (v *hangingServer) start(t *testing.T) string {
	v.once.Do(func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			v.err = err
			return
		}
		v.addr = ln.Addr().String()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				v.mu.Lock()
				v.held = append(v.held, c)
				v.mu.Unlock()
			}
		}()
	})
	if v.err != nil {
		t.Fatal(v.err)
	}
	return v.addr
}

// hangUp closes the connections it holds.
func (v *hangingServer) hangUp() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, c := range v.held {
		c.Close()
	}
	v.held = nil
}

// A produce request whose partitions only inliners see and that holds at
// most serialMaxBytes is intercepted partition after partition on the
// request's goroutine; a larger one hands all but its last partition to
// workers. A small request whose calls all run over their budget fails in
// 1 + ⌈(n−1)/maxParallelPartitions⌉ budgets, not n: once serialMaxTime has
// passed, the partitions left run side by side.
func TestSmallProduceRequestSerial(t *testing.T) {
	t.Run("placement", func(t *testing.T) {
		for _, tc := range []struct {
			name        string
			value, n    int
			codec       int16
			allOnCaller bool
		}{
			{"small", 100, 8, 0, true},
			{"over serialMaxBytes", serialMaxBytes / 2, 3, 0, false},
			{"compressed", 100, 8, 3, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// A small request runs serially only while it takes less
				// than serialMaxTime: on a loaded machine (-race beside
				// stress-ng) a run may be descheduled past it and go side by
				// side, as it should. Tried until one run is quick.
				for attempt := 1; ; attempt++ {
					var mu sync.Mutex
					where := map[string]int{}
					ch := NewChain([]Instance{{Produce: inlineIcpt{icpt(t, "ic", ".*", func(_ context.Context, r *Record) error {
						mu.Lock()
						where[goid()]++
						mu.Unlock()
						return nil
					})}}}, Options{})
					batches := map[string][]byte{}
					for i := range tc.n {
						batches[fmt.Sprintf("t%d", i)] = plainBatch(t, tc.codec, -1, strings.Repeat("v", tc.value))
					}
					req := buildRequest(t, batches)
					// Watched from the start when not run serially (a
					// quick request's proxy hook, WithSlowRequest).
					var watched atomic.Int64
					ctx := WithSlowRequest(context.Background(), func(ctx context.Context) context.Context {
						watched.Add(1)
						return ctx
					})
					start := time.Now()
					out := ch.InterceptProduce(ctx, req, nil)
					took := time.Since(start)
					out.Release()
					if len(out.Answered) != 0 || len(req.Topics) != tc.n {
						t.Fatalf("answered %+v, %d topics left", out.Answered, len(req.Topics))
					}
					if tc.allOnCaller && took >= serialMaxTime && attempt < 50 {
						continue // the precondition did not hold: again
					}
					if got := len(where) == 1 && where[goid()] == tc.n; got != tc.allOnCaller {
						t.Fatalf("calls by goroutine %v (the request's: %s), in %v; all on the request's goroutine: %v, want %v", where, goid(), took, got, tc.allOnCaller)
					}
					if want := map[bool]int64{true: 0, false: 1}[tc.allOnCaller]; watched.Load() != want {
						t.Fatalf("the slow hook was called %d times, want %d", watched.Load(), want)
					}
					break
				}
			})
		}
	})
	t.Run("stuck calls", func(t *testing.T) {
		const parts, budget = 17, 400 * time.Millisecond // 1 + 2 rounds of 8
		ch, req := stuckRequest(t, parts, budget)
		start := time.Now()
		out := ch.InterceptProduce(context.Background(), req, nil)
		took := time.Since(start)
		defer out.Release()
		if len(out.Answered) != parts || out.Forward {
			t.Fatalf("answered %d partitions, forward %v", len(out.Answered), out.Forward)
		}
		for _, a := range out.Answered {
			if a.ErrorCode != kerr.RequestTimedOut.Code {
				t.Fatalf("partition answered %+v", a)
			}
		}
		// One partition after the other would take parts budgets (6.8 s).
		if took < 3*budget || took > 5*budget {
			t.Fatalf("the request took %v with a budget of %v per call, want 3 budgets (1 + ⌈16/8⌉)", took, budget)
		}
		t.Logf("%d stuck partitions failed in %v (budget %v)", parts, took, budget)
	})
	// The proxy watches such a request only once it is slow
	// (WithSlowRequest): the hook is called once, by the chain's watchdog
	// when the first call has run serialMaxTime, and the call in progress
	// and the partitions left run under its context. A client gone by then
	// stops them at once, the call in progress too.
	t.Run("slow hook", func(t *testing.T) {
		// Without the hook: 1 + ⌈16/8⌉ = 3 budgets; with it, about a
		// watchdog look (budget/8).
		const parts, budget = 17, time.Second
		ch, req := stuckRequest(t, parts, budget)
		var calls atomic.Int64
		ctx := WithSlowRequest(context.Background(), func(ctx context.Context) context.Context {
			calls.Add(1)
			gone, cancel := context.WithCancel(ctx)
			cancel() // the client went away meanwhile
			return gone
		})
		start := time.Now()
		out := ch.InterceptProduce(ctx, req, nil)
		took := time.Since(start)
		defer out.Release()
		if calls.Load() != 1 {
			t.Fatalf("the slow hook was called %d times, want once", calls.Load())
		}
		over, stopped := 0, 0
		for _, a := range out.Answered {
			switch {
			case a.ErrorCode == kerr.RequestTimedOut.Code && strings.Contains(a.ErrorMessage, "ran over"):
				over++
			case a.ErrorCode == kerr.RequestTimedOut.Code && strings.Contains(a.ErrorMessage, "interceptors stopped"):
				stopped++
			default:
				t.Fatalf("partition answered %+v", a)
			}
		}
		if over != 0 || stopped != parts || took >= budget {
			t.Fatalf("%d partitions ran over their budget, %d were stopped, in %v (budget %v): want 0 and %d, within a budget",
				over, stopped, took, budget, parts)
		}
	})
}

// stuckRequest is a chain with budget whose inliner waits until its call is
// cancelled, and a request of parts one-record partitions (topics t0…).
func stuckRequest(t *testing.T, parts int, budget time.Duration) (*Chain, *kmsg.ProduceRequest) {
	ch := NewChain([]Instance{{Produce: inlineIcpt{icpt(t, "stuck", ".*", func(ctx context.Context, _ *Record) error {
		<-ctx.Done()
		return ctx.Err()
	})}}}, Options{Timeout: budget})
	batches := map[string][]byte{}
	for i := range parts {
		batches[fmt.Sprintf("t%d", i)] = plainBatch(t, 0, -1, "v")
	}
	return ch, buildRequest(t, batches)
}

// The inline watchdog's goroutine runs only while inline runs are in
// progress: it ends within a tick (budget/dogTicks) of the last one, and
// starts again for the next.
func TestInlineDogEnds(t *testing.T) {
	ch := NewChain([]Instance{{Produce: inlineIcpt{icpt(t, "ic", ".*", func(context.Context, *Record) error { return nil })}}}, Options{Timeout: 80 * time.Millisecond})
	for round := range 2 {
		req := buildRequest(t, map[string][]byte{"a": plainBatch(t, 0, -1, "v"), "b": plainBatch(t, 0, -1, "w")})
		out := ch.InterceptProduce(context.Background(), req, nil)
		if len(out.Answered) != 0 || !out.Forward {
			t.Fatalf("round %d: answered %+v", round, out.Answered)
		}
		out.Release()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ch.dog.mu.Lock()
			running, live := ch.dog.running, len(ch.dog.live)
			ch.dog.mu.Unlock()
			if !running && live == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the watchdog still runs (%d runs watched) 10 s after the request", round, live)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
