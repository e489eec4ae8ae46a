package cli

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// objectStore is a store with key-level operations.
type objectStore interface {
	payloadstore.PayloadStore
	payloadstore.ObjectStore
}

// slowStat is a store whose Stat (what Plan.Confirm asks first, after the
// acknowledgement) takes delay.
type slowStat struct {
	objectStore
	delay time.Duration
}

func (s slowStat) Stat(ctx context.Context, key string) (payloadstore.ObjectInfo, error) {
	time.Sleep(s.delay)
	return s.objectStore.Stat(ctx, key)
}

// fileStore opens a file store in a temporary directory, with the
// large-message config naming it.
func fileStore(t *testing.T) (payloadstore.PayloadStore, largemessage.Config) {
	t.Helper()
	cfg, err := largemessage.ParseConfig(map[string]string{largemessage.KeyStoreURL: "file://" + t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	st, err := cfg.OpenStore(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, cfg
}

// testSender is what openSender makes, over store and a client of brokers
// with delivery.timeout.ms delivery.
func testSender(t *testing.T, brokers string, store payloadstore.PayloadStore, cfg largemessage.Config, delivery time.Duration) *sender {
	t.Helper()
	answers := &produceAnswers{}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.WithHooks(answers), kgo.RecordDeliveryTimeout(delivery))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	prod, err := largemessage.NewProducer(cl, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &sender{prod: prod, store: store, hasStore: true, codec: largemessage.Codec{Type: "none"}, stderr: io.Discard,
		delivery: delivery, answers: answers}
}

// The broker acknowledges the record at once, but the Producer's
// post-acknowledgement Confirm (one Stat of the payload) takes longer than
// delivery.timeout.ms + deliveryGrace + safeAbortWait + abortWait: deliver's
// timer must not give up on a record that is in the topic (it said "the
// record was not sent", inviting a retry and a duplicate; found by a
// fault-hunting helper).
func TestDeliveryTimeoutGivesUpOnAcknowledgedRecord(t *testing.T) {
	_, brokers := cluster(t)
	ctx := context.Background()
	st, cfg := fileStore(t)
	inner, ok := st.(objectStore)
	if !ok {
		t.Fatalf("the file store (%T) has no key-level operations", st)
	}
	store := slowStat{inner, 9 * time.Second}
	s := testSender(t, brokers, store, cfg, time.Second)
	value := make([]byte, 2<<20)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(value)
	res, err := s.sendBytes(ctx, "t", "big", nil, value, nil)
	t.Logf("sendBytes: %+v, err %v", res, err)

	// What is in the topic?
	rd, err2 := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err2 != nil {
		t.Fatal(err2)
	}
	defer rd.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) == 0 && pctx.Err() == nil {
		recs = append(recs, rd.PollFetches(pctx).Records()...)
	}
	if len(recs) == 0 {
		t.Fatal("no record in the topic: the broker (kfake, answering at once) acknowledged nothing")
	}
	ref, derr := largemessage.DecodeReference(recs[0].Value)
	if derr != nil || !largemessage.IsOffloaded(recs[0]) {
		t.Fatalf("record in the topic is not a reference: %v", derr)
	}
	if err != nil {
		t.Errorf("ferry produce reports the record as not produced (%v), but it is in the topic at t/%d@%d (reference %s)",
			err, recs[0].Partition, recs[0].Offset, ref.FullPayloadPath)
	}
	if b, derr := payloadstore.DownloadBytes(ctx, inner, ref.FullPayloadPath); derr != nil || !bytes.Equal(b, value) {
		t.Errorf("the payload of the acknowledged record: equal %v, %v", bytes.Equal(b, value), derr)
	}
}
