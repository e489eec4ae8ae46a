package interceptor

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// After the broker acknowledged a partition, ProduceOutcome.Confirm brings
// back the payloads the interceptor published for it that ferry gc moved to
// quarantine (copied back) or deleted (published again from the request's
// bytes) while the request was on its way; a refused partition is not
// confirmed.
func TestLargeMessageConfirmAfterAck(t *testing.T) {
	in, store := lmSetup(t, map[string]string{largemessage.KeyThreshold: "1024"})
	cl := newCluster(t, map[string]map[string]*string{"big": nil})
	cl.use(Options{}, in)
	c := cl.client(t)
	value := randomBytes(77, 30_000)
	if err := firstErr(produceBatch(t, c, &kgo.Record{Topic: "big", Value: value})); err != nil {
		t.Fatal(err)
	}
	resp, _ := fetchRaw(t, c, "big")
	raw := records(t, "big", &resp.Topics[0].Partitions[0])
	if len(raw) != 1 || !largemessage.IsOffloaded(raw[0]) {
		t.Fatalf("%d records, offloaded %v", len(raw), len(raw) == 1 && largemessage.IsOffloaded(raw[0]))
	}
	ref, err := largemessage.DecodeReference(raw[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := payloadstore.Objects(store)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ops.Root().Key(ref.FullPayloadPath)
	if err != nil {
		t.Fatal(err)
	}
	sent := cl.sent[0].Topics[0]
	ack := func(code int16) *kmsg.ProduceResponse {
		r := kmsg.NewPtrProduceResponse()
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = sent.Topic, sent.TopicID
		p := kmsg.NewProduceResponseTopicPartition()
		p.ErrorCode = code
		rt.Partitions = append(rt.Partitions, p)
		r.Topics = append(r.Topics, rt)
		return r
	}
	out := cl.outcomes[0]
	ctx := context.Background()

	if n, errs := out.Confirm(ctx, ack(0)); n != 0 || len(errs) != 0 {
		t.Fatalf("object in place: %d brought back, %v", n, errs)
	}
	qkey := "big/.ferry-gc/q/run/" + strings.TrimPrefix(key, "big/")
	if err := ops.Move(ctx, key, qkey); err != nil {
		t.Fatal(err)
	}
	if n, errs := out.Confirm(ctx, ack(6 /* NOT_LEADER_OR_FOLLOWER: refused */)); n != 0 || len(errs) != 0 {
		t.Fatalf("refused partition confirmed: %d, %v", n, errs)
	}
	if n, errs := out.Confirm(ctx, ack(0)); n != 1 || len(errs) != 0 {
		t.Fatalf("object in quarantine: %d brought back, %v", n, errs)
	}
	if err := ops.Remove(ctx, qkey); err != nil {
		t.Fatal(err)
	}
	if err := ops.Remove(ctx, key); err != nil {
		t.Fatal(err)
	}
	if n, errs := out.Confirm(ctx, ack(0)); n != 1 || len(errs) != 0 {
		t.Fatalf("object deleted: %d brought back, %v", n, errs)
	}
	got, err := payloadstore.DownloadBytes(ctx, store, ref.FullPayloadPath)
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("after the confirmation: %v", err)
	}
}
