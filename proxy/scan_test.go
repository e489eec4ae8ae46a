package proxy

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
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

// endpointResponses builds Produce (v9+) and Fetch (v12+) responses of
// every version kmsg knows, with and without KIP-951 endpoints, with the
// fields that vary in size filled (error records and messages, aborted
// transactions, per-partition tags, records), seeded by r.
func endpointResponses(r *rand.Rand) []kmsg.Response {
	var out []kmsg.Response
	str := func() string { return strings.Repeat("x", r.IntN(40)) }
	for v := int16(produceFirstFlexible); v <= kmsg.NewPtrProduceResponse().MaxVersion(); v++ {
		for _, brokers := range []int{0, 1, 3} {
			resp := kmsg.NewPtrProduceResponse()
			resp.Version = v
			for ti := range 1 + r.IntN(3) {
				rt := kmsg.NewProduceResponseTopic()
				rt.Topic = fmt.Sprint("t", ti)
				rt.TopicID[0] = byte(ti + 1)
				for p := range 1 + r.IntN(4) {
					rp := kmsg.NewProduceResponseTopicPartition()
					rp.Partition, rp.BaseOffset = int32(p), r.Int64()
					if r.IntN(2) == 0 {
						rp.ErrorCode = 6
						msg := str()
						rp.ErrorMessage = &msg
						rp.CurrentLeader.LeaderID, rp.CurrentLeader.LeaderEpoch = 1, 7
						for range r.IntN(3) {
							e := kmsg.NewProduceResponseTopicPartitionErrorRecord()
							e.RelativeOffset = int32(r.IntN(100))
							m := str()
							e.ErrorMessage = &m
							rp.ErrorRecords = append(rp.ErrorRecords, e)
						}
					}
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			for b := range brokers {
				br := kmsg.NewProduceResponseBroker()
				br.NodeID, br.Host, br.Port = int32(b), "broker-"+str(), 9092
				resp.Brokers = append(resp.Brokers, br)
			}
			out = append(out, resp)
		}
	}
	for v := int16(fetchFirstFlexible); v <= kmsg.NewPtrFetchResponse().MaxVersion(); v++ {
		for _, brokers := range []int{0, 1, 3} {
			resp := kmsg.NewPtrFetchResponse()
			resp.Version, resp.SessionID = v, r.Int32()
			for ti := range 1 + r.IntN(3) {
				rt := kmsg.NewFetchResponseTopic()
				rt.TopicID[0] = byte(ti + 1)
				for p := range 1 + r.IntN(4) {
					rp := kmsg.NewFetchResponseTopicPartition()
					rp.Partition, rp.HighWatermark = int32(p), r.Int64()
					rp.RecordBatches = make([]byte, r.IntN(300))
					for range r.IntN(3) {
						a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
						a.ProducerID, a.FirstOffset = r.Int64(), r.Int64()
						rp.AbortedTransactions = append(rp.AbortedTransactions, a)
					}
					if r.IntN(2) == 0 {
						rp.ErrorCode, rp.RecordBatches = 6, nil
						rp.CurrentLeader.LeaderID, rp.CurrentLeader.LeaderEpoch = 2, 3
						rp.DivergingEpoch.Epoch, rp.DivergingEpoch.EndOffset = 4, 5
					}
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			for b := range brokers {
				br := kmsg.NewFetchResponseBroker()
				br.NodeID, br.Host, br.Port = int32(b), "broker-"+str(), 9092
				resp.Brokers = append(resp.Brokers, br)
			}
			out = append(out, resp)
		}
	}
	return out
}

// brokersOf is what kmsg decodes of a response's KIP-951 endpoints.
func brokersOf(resp kmsg.Response) int {
	switch r := resp.(type) {
	case *kmsg.ProduceResponse:
		return len(r.Brokers)
	case *kmsg.FetchResponse:
		return len(r.Brokers)
	}
	return 0
}

// namesBrokers agrees with kmsg on every version: a response forwarded
// without decoding never carries an endpoint, and any truncation of it is
// an error (sent through the full decode), never "no endpoint".
func TestNamesBrokersAgreesWithKmsg(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	checked := 0
	for range 20 {
		for _, resp := range endpointResponses(r) {
			body := resp.AppendTo(nil)
			named, err := namesBrokers(resp.Key(), resp.GetVersion(), body)
			if err != nil || named != (brokersOf(resp) > 0) {
				t.Fatalf("%s v%d with %d brokers: namesBrokers = %v, %v", kmsg.NameForKey(resp.Key()), resp.GetVersion(), brokersOf(resp), named, err)
			}
			for cut := range len(body) {
				if named, err := namesBrokers(resp.Key(), resp.GetVersion(), body[:cut]); err == nil && !named && brokersOf(resp) > 0 {
					t.Fatalf("%s v%d cut at %d of %d: no endpoint found and no error", kmsg.NameForKey(resp.Key()), resp.GetVersion(), cut, len(body))
				}
			}
			checked++
		}
	}
	if _, err := namesBrokers(keyProduce, 9, nil); err == nil {
		t.Error("Produce v9 has no endpoints: want an error (the caller decodes)")
	}
	t.Logf("%d responses checked", checked)
}

// FuzzNamesBrokers: whatever the bytes, a body namesBrokers passes as
// naming no broker decodes (kmsg) to no broker, or does not decode.
func FuzzNamesBrokers(f *testing.F) {
	for _, resp := range endpointResponses(rand.New(rand.NewPCG(3, 4))) {
		f.Add(resp.Key(), resp.GetVersion(), resp.AppendTo(nil))
	}
	f.Fuzz(func(t *testing.T, key, version int16, body []byte) {
		named, err := namesBrokers(key, version, body)
		if err != nil || named {
			return
		}
		resp := kmsg.ResponseForKey(key)
		resp.SetVersion(version)
		if resp.ReadFrom(body) == nil && brokersOf(resp) > 0 {
			t.Fatalf("%s v%d: namesBrokers found no endpoint, kmsg decodes %d", kmsg.NameForKey(key), version, brokersOf(resp))
		}
	})
}
