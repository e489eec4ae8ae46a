package cli

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// exitWithin waits for ferry to exit on its own, at most limit, and
// returns how long that took from start.
func (c *child) exitWithin(t *testing.T, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(time.Until(start.Add(limit))):
		t.Fatalf("ferry still running %s after the stall (delivery.timeout.ms=3000); stderr %q", limit, c.stderr.String())
	}
	took := time.Since(start)
	t.Logf("ferry exited %d, %s after the stall; stderr:\n%s", c.code, took.Round(time.Millisecond), c.stderr.String())
	return took
}

// The broker answers the first Produce request, then none, on a connection
// that stays open (as a broker stopped with SIGSTOP): with
// delivery.timeout.ms=3000 ferry produce gives up on the second file's
// reference within delivery.timeout.ms + 2 s (franz-go alone retries an
// idempotent record whose request went unanswered for ever), exits 1, keeps
// its payload (the record may be in the topic) and names what was produced.
func TestDeliveryTimeoutUnansweredProduce(t *testing.T) {
	p, storeDir, small, big, third := stalledSecondProduce(t, 31, "-X", "delivery.timeout.ms=3000")
	took := p.exitWithin(t, time.Now(), 30*time.Second) // 20 s is franz-go's read deadline
	if p.code != 1 {
		t.Errorf("exit %d, want 1", p.code)
	}
	if took > 15*time.Second {
		t.Errorf("ferry took %s to give up (delivery.timeout.ms=3000)", took)
	}
	objs := storeObjects(t, storeDir)
	if len(objs) != 1 {
		t.Fatalf("store objects %v, want big's payload", objs)
	}
	r := runResult{stderr: p.stderr.String()}
	oneErrorLine(t, r, "ferry: "+big+": producing the reference: timed out after delivery.timeout.ms=3000 without an acknowledgement: its produce request was sent and not answered")
	oneErrorLine(t, r, "; its payload file://"+filepath.ToSlash(objs[0])+
		" was kept: the produce request was sent but not answered, so the record may be in the topic")
	oneErrorLine(t, r, "; produced 1 of 3 inputs: "+small+" t/0@0; not produced: "+big+", "+third)
}

// The producer id is never granted, so the record waits in the client and
// is never sent: ferry produce gives up on it after delivery.timeout.ms
// (franz-go alone waits for its InitProducerID retries, several times
// longer), exits 1 and deletes the payload published for it.
func TestDeliveryTimeoutBeforeSend(t *testing.T) {
	c, brokers := cluster(t)
	held := stall(c, kmsg.InitProducerID, 0)
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	big, _ := randomFile(t, dir, "big", 2<<20, 34)

	p := startFerry(t, "produce", "--brokers", brokers, "-t", "t", "--store", storeDir, "-X", "delivery.timeout.ms=3000", big)
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatalf("no InitProducerID request; stderr %q", p.stderr.String())
	}
	took := p.exitWithin(t, time.Now(), 30*time.Second)
	if p.code != 1 {
		t.Errorf("exit %d, want 1", p.code)
	}
	if took > 15*time.Second {
		t.Errorf("ferry took %s to give up (delivery.timeout.ms=3000)", took)
	}
	oneErrorLine(t, runResult{stderr: p.stderr.String()}, "ferry: "+big+": producing the reference: timed out after delivery.timeout.ms=3000 without an acknowledgement: the record was not sent")
	oneErrorLine(t, runResult{stderr: p.stderr.String()}, " was deleted")
	if objs := storeObjects(t, storeDir); len(objs) != 0 {
		t.Errorf("store objects left: %v", objs)
	}
}
