package proxy

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

func fetchReq(sessionID, epoch int32, parts map[int32]int64, forget ...int32) *kmsg.FetchRequest {
	r := kmsg.NewPtrFetchRequest()
	r.Version = 12
	r.MaxBytes = 1 << 20
	r.SessionID, r.SessionEpoch = sessionID, epoch
	if len(parts) > 0 {
		t := kmsg.NewFetchRequestTopic()
		t.Topic = "t"
		for p, off := range parts {
			fp := kmsg.NewFetchRequestTopicPartition()
			fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = p, off, 100+p
			t.Partitions = append(t.Partitions, fp)
		}
		r.Topics = append(r.Topics, t)
	}
	if len(forget) > 0 {
		ft := kmsg.NewFetchRequestForgottenTopic()
		ft.Topic, ft.Partitions = "t", forget
		r.ForgottenTopics = append(r.ForgottenTopics, ft)
	}
	return r
}

// An incremental fetch (KIP-227) that leaves out partitions that did not
// change still gets their fetch offsets and limits from its session.
func TestFetchSessions(t *testing.T) {
	s := &Server{mem: interceptor.NewMemory(1 << 20)}
	fs := fetchSessions{s: s}
	k := func(p int32) interceptor.FetchPartition { return interceptor.FetchPartition{Topic: "t", Partition: p} }

	l, st := fs.limits(fetchReq(0, 0, map[int32]int64{0: 5, 1: 7}))
	if st == nil || l.FetchOffset[k(0)] != 5 {
		t.Fatalf("a full request opening a session: %+v %v", l, st)
	}
	fs.opened(42, st)
	// Incremental: partition 1 moved on, partition 0 left out.
	l, _ = fs.limits(fetchReq(42, 1, map[int32]int64{1: 9}))
	if l.FetchOffset[k(0)] != 5 || l.FetchOffset[k(1)] != 9 || l.PartitionMaxBytes[k(0)] != 100 {
		t.Fatalf("incremental: %+v", l)
	}
	// Forget partition 0.
	l, _ = fs.limits(fetchReq(42, 2, nil, 0))
	if _, ok := l.FetchOffset[k(0)]; ok || l.FetchOffset[k(1)] != 9 {
		t.Fatalf("after forgetting partition 0: %+v", l)
	}
	// An unknown session: the request's own limits only.
	if l, _ := fs.limits(fetchReq(7, 3, map[int32]int64{2: 1})); len(l.FetchOffset) != 1 {
		t.Fatalf("unknown session: %+v", l)
	}
	// Closing (epoch -1) forgets the session and gives its memory back.
	fs.limits(fetchReq(42, -1, nil))
	if _, ok := fs.byID[42]; ok || s.mem.InUse() != 0 {
		t.Fatalf("closed session still held (%d bytes)", s.mem.InUse())
	}
}
