package proxy

import (
	"encoding/binary"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A topic whose partition array length is negative (kmsg decodes it as
// empty) counts 0 partitions: it cannot cancel the other topics' partitions
// out of the count and so out of the memory charged before decoding.
func TestShapeNegativeArrayLength(t *testing.T) {
	req := kmsg.NewPtrFetchRequest()
	req.Version = 11 // not flexible: int32 array lengths
	for _, name := range []string{"a", "b"} {
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = name
		for p := range 1000 {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition = int32(p)
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	neg := kmsg.NewFetchRequestTopic()
	neg.Topic = "z"
	req.Topics = append(req.Topics, neg)
	body := req.AppendTo(nil)
	// The last topic's partition array: 0 partitions, its length at the
	// end of the topic ("z": int16 length and 1 byte), then the
	// forgotten-topics array and the rack id follow.
	at := -1
	for i := len(body) - 4; i >= 0; i-- {
		if body[i] == 0 && body[i+1] == 1 && body[i+2] == 'z' {
			at = i + 3
			break
		}
	}
	if at < 0 {
		t.Fatal("topic z not found")
	}
	binary.BigEndian.PutUint32(body[at:], 0x80000000) // -2^31
	topics, partitions, err := fetchShape(req.Version, body, false)
	if err != nil {
		t.Fatal(err)
	}
	if topics != 3 || partitions != 2000 {
		t.Fatalf("counted %d topics and %d partitions, want 3 and 2000", topics, partitions)
	}
	// kmsg agrees: it decodes the negative length as no partitions.
	dec := kmsg.NewPtrFetchRequest()
	dec.Version = req.Version
	if err := dec.ReadFrom(body); err != nil || len(dec.Topics) != 3 || len(dec.Topics[2].Partitions) != 0 {
		t.Fatalf("kmsg: %v, %d topics", err, len(dec.Topics))
	}
}
