package interceptor

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type abortCounter struct{ aborts int }

func (a *abortCounter) Commit(context.Context, *Record) error { return nil }
func (a *abortCounter) Abort(context.Context)                 { a.aborts++ }

// Refused deletes the payloads of a partition only for error codes with
// which the broker appended nothing. NOT_LEADER_OR_FOLLOWER is not one: an
// acks=all produce appended by a leader that loses leadership before its
// followers confirm is answered with it, the new leader may hold the batch,
// and the producer's idempotent retry is then acknowledged as a duplicate
// of the first: its payloads must stay (found by TestFleetFaults during a
// rolling restart: a record in the log naming a deleted object).
func TestProduceOutcomeRefusedKeepsMaybeAppended(t *testing.T) {
	for _, c := range []struct {
		code      int16
		wantAbort bool
	}{
		{kerr.NotLeaderForPartition.Code, false},
		{kerr.RequestTimedOut.Code, false},
		{kerr.NotEnoughReplicasAfterAppend.Code, false},
		{0, false},
		{kerr.NotEnoughReplicas.Code, true},
		{kerr.MessageTooLarge.Code, true},
		{kerr.OutOfOrderSequenceNumber.Code, true},
	} {
		d := &abortCounter{}
		k := FetchPartition{Topic: "t", Partition: 0}
		o := ProduceOutcome{committed: map[FetchPartition][]Deferred{k: {d}}}
		resp := kmsg.NewPtrProduceResponse()
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = "t"
		rp := kmsg.NewProduceResponseTopicPartition()
		rp.ErrorCode = c.code
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		n := o.Refused(context.Background(), resp)
		if got := d.aborts > 0; got != c.wantAbort || (n > 0) != c.wantAbort {
			t.Errorf("error code %d (%v): aborted %v (%d partitions undone), want %v", c.code, kerr.ErrorForCode(c.code), got, n, c.wantAbort)
		}
	}
}
