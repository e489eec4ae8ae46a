package integration

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// The store is down when an acknowledged record's payload must be brought
// back (real broker, real S3 behind a fault proxy): gc deleted the payload
// while the Produce request was held, then S3 stops answering the
// Producer. Its promise must carry the error (the record is in the log and
// unreadable), never nil.
func TestGCConfirmStoreDown(t *testing.T) {
	direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-gc")
	h := newProduceHold()
	e := storeEnv(t, via, h.dialer())
	gcStore, err := payloadstore.Open(context.Background(), direct, payloadstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gcStore.Close() })
	topic := newTopic(t, nil)

	value := randomBytes(7101, 4000)
	rec := &kgo.Record{Topic: topic, Value: bytes.Clone(value)}
	done := make(chan error, 1)
	h.arm()
	go func() { done <- e.prod.ProduceSync(ctxT(t, 5*time.Minute), rec).FirstErr() }()
	select {
	case <-h.held:
	case err := <-done:
		t.Fatalf("produce finished while it should be held: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the Produce request was never held")
	}
	sum, err := lifecycle.Collect(ctxT(t, 3*time.Minute), client(t), gcStore, lifecycle.Options{
		Topic: topic, Grace: 0, GraceSet: true, Settle: time.Second, SettleSet: true, Mode: lifecycle.ModeFull})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Deleted != 1 {
		t.Fatalf("gc deleted %d objects, want the held record's 1 (summary %+v)", sum.Deleted, sum)
	}
	fp.Set(faultproxy.Down, -1)
	h.let()
	perr := <-done
	fp.Set(faultproxy.Pass, 0)
	if fp.Count(faultproxy.Down) == 0 {
		t.Fatal("the Producer never reached the store after the acknowledgement")
	}
	recs := readAll(t, topic)
	if len(recs) != 1 {
		t.Fatalf("%d records in %s, want 1", len(recs), topic)
	}
	rerr := largemessage.NewDeserializer(gcStore, false).Resolve(ctxT(t, time.Minute), recs[0])
	if !errors.Is(rerr, payloadstore.ErrPayloadNotFound) {
		t.Fatalf("resolving the record: %v, want ErrPayloadNotFound (the store was down: nothing brought it back)", rerr)
	}
	if perr == nil {
		t.Fatal("the Producer's promise reported success for an acknowledged record whose payload is gone")
	}
	t.Logf("the promise's error: %v", perr)
}
