package interceptor

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
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
