package lifecycle_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// A leftover quarantine folder whose manifest names offsets beyond the
// partitions' ends (a damaged or stray manifest; no real run read past a
// high watermark) must not let gc skip the recheck of its objects: an
// object a record in the log references is restored, not deleted.
func TestCollectManifestBeyondEnd(t *testing.T) {
	cl := newCluster(t)
	mem := memStore(t, nil)
	ctx := ctxT(t)
	paths := produce(t, cl, mem, 1, noise(31, 3000))
	ops, _ := payloadstore.Objects(mem)
	key, kp, err := ops.Root().KeyOf(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	run := "20260101T000000.000000000Z-0badf00d"
	if err := ops.Move(ctx, key, "t/.ferry-gc/q/"+run+"/"+kp.Shard+"/"+kp.ID); err != nil {
		t.Fatal(err)
	}
	m, _ := json.Marshal(map[string]any{"version": 1, "run": run, "topic": "t", "mode": "full",
		"start": time.Now().Add(-time.Hour), "e1": map[string]int64{"0": 1 << 40, "1": 1 << 40, "2": 1 << 40}})
	if err := ops.Put(ctx, "t/.ferry-gc/q/"+run+"/manifest.json", m); err != nil {
		t.Fatal(err)
	}
	sum, err := lifecycle.Collect(ctx, cl, mem, lifecycle.Options{Topic: "t", Grace: time.Hour, SettleSet: true})
	if err != nil {
		t.Fatal(err)
	}
	if !exists(t, mem, paths[0]) {
		t.Fatalf("gc deleted an object a record in the log references, trusting a manifest beyond the partitions' ends (summary %+v)", sum)
	}
}
