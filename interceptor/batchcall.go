package interceptor

import (
	"context"
	"fmt"
	"time"
)

// BatchInterceptor is implemented by a ProduceRequestInterceptor or
// FetchResponseInterceptor that processes a whole record batch in one call
// (the wasm interceptor: one module call per batch instead of one per
// record). When a batch's interceptors include one, the chain runs them
// interceptor by interceptor over the batch (each BatchInterceptor once,
// the others record by record) instead of record by record, with the same
// results: what one interceptor skipped or failed is not passed to the
// next. ProcessRecord is not called then.
type BatchInterceptor interface {
	// ProcessBatch changes the records in place, as ProcessRecord would,
	// and returns nil when every record passed, or one error per record
	// (nil, ErrSkipRecord, or an error failing the record as
	// ProcessRecord's would). A non-nil err fails the batch's partition
	// (the module trapped, ran over its budget, gave malformed output).
	// ctx is cancelled when the call runs over the chain's time budget.
	ProcessBatch(ctx context.Context, recs []*Record) (errs []error, err error)
}

// stageResult is a record's outcome of a staged run: the first error an
// interceptor gave it (nil: it passed them all) and that interceptor.
type stageResult struct {
	name string
	err  error
}

// hasBatch reports whether ps holds a BatchInterceptor.
func hasBatch(ps []proc) bool {
	for i := range ps {
		if ps[i].batch != nil {
			return true
		}
	}
	return false
}

// staged runs ps over rs interceptor by interceptor: a BatchInterceptor
// once over the records still passing, the others record by record. A
// record that an interceptor skips or fails is passed to no later one.
// rs[k] is record base+k of its batch (for the watcher's messages).
func (c *Chain) staged(ctx context.Context, w *watch, ps []proc, rs []Record, base int) []stageResult {
	res := make([]stageResult, len(rs))
	live := make([]*Record, 0, len(rs))
	idx := make([]int, 0, len(rs))
	for j := range ps {
		p := &ps[j]
		if p.batch == nil {
			for i := range rs {
				if res[i].err == nil {
					if err := c.call(ctx, w, p, base+i, &rs[i]); err != nil {
						res[i] = stageResult{p.name, err}
					}
				}
			}
			continue
		}
		live, idx = live[:0], idx[:0]
		for i := range rs {
			if res[i].err == nil {
				live = append(live, &rs[i])
				idx = append(idx, i)
			}
		}
		if len(live) == 0 {
			break
		}
		errs, err := c.callBatch(ctx, w, p, base+idx[0], live)
		if err != nil {
			// The batch failed as a whole: its first record carries it.
			res[idx[0]] = stageResult{p.name, err}
			for _, i := range idx[1:] {
				res[i] = stageResult{p.name, err}
			}
			break
		}
		for k, e := range errs {
			if e != nil && k < len(idx) {
				res[idx[k]] = stageResult{p.name, e}
			}
		}
	}
	return res
}

// callBatch makes one timed BatchInterceptor call (as call does for one
// record); first is the index of its first record, for the watcher's
// message.
func (c *Chain) callBatch(ctx context.Context, w *watch, p *proc, first int, recs []*Record) ([]error, error) {
	w.name.Store(&p.name)
	w.index.Store(int64(first))
	start := callClock()
	w.start.Store(start)
	errs, err := p.batch(ctx, recs)
	if p.obs != nil {
		p.obs.Observe(time.Duration(callClock() - start).Seconds())
	}
	w.start.Store(0)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("stopped: %w", ctx.Err())
	}
	if err == nil && errs != nil && len(errs) != len(recs) {
		err = fmt.Errorf("interceptor %s returned %d results for %d records", p.name, len(errs), len(recs))
	}
	return errs, err
}
