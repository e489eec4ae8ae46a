package lifecycle_test

import (
	"sync"
	"testing"
	"time"

	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// Two gc runs of one topic at once (the docs ask for one, nothing enforces
// it): each treats the other's folder as left over. Whatever their
// interleaving, every object a record references stays readable, every
// orphan is gone once both finished, and no quarantine is left.
func TestCollectTwoRunsAtOnce(t *testing.T) {
	for i := range 5 {
		cl := newCluster(t)
		mem := memStore(t, nil)
		ctx := ctxT(t)
		var live []string
		for p := int32(0); p < 3; p++ {
			live = append(live, produce(t, cl, mem, p, noise(uint64(100*i)+uint64(p), 3000), noise(uint64(100*i)+10+uint64(p), 3000))...)
		}
		var orphans []string
		for j := range 6 {
			r, err := payloadstore.PublishBytes(ctx, mem, "t", noise(uint64(100*i)+50+uint64(j), 3000))
			if err != nil {
				t.Fatal(err)
			}
			orphans = append(orphans, r.FullPayloadPath)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[k] = lifecycle.Collect(ctx, cl, mem, lifecycle.Options{Topic: "t", GraceSet: true, Settle: 10 * time.Millisecond, SettleSet: true, Mode: lifecycle.ModeFull, StoreConcurrency: 2})
			}()
		}
		wg.Wait()
		t.Logf("round %d: errors %v", i, errs)
		for _, p := range live {
			if !exists(t, mem, p) {
				t.Fatalf("round %d: a referenced object is gone: %s (errors %v)", i, p, errs)
			}
		}
		// A third run finishes what a failed operation left.
		if _, err := lifecycle.Collect(ctx, cl, mem, lifecycle.Options{Topic: "t", GraceSet: true, SettleSet: true, Mode: lifecycle.ModeFull}); err != nil {
			t.Fatalf("round %d: the run after: %v", i, err)
		}
		for _, p := range orphans {
			if exists(t, mem, p) {
				t.Fatalf("round %d: an orphan survived three runs: %s", i, p)
			}
		}
		if q := quarantineKeys(t, mem); len(q) != 0 {
			t.Fatalf("round %d: quarantine still holds %v", i, q)
		}
	}
}
