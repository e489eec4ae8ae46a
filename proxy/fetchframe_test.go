package proxy

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A response written in parts is byte for byte the response encoded whole,
// on every Fetch version the proxy decodes, whatever mix of large, small,
// empty and null record sets, errors and aborted transactions it holds.
func TestSpliceFrameIsTheWholeFrame(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	header := []byte{0, 0, 0, 7, 0} // a correlation id and an empty tag section
	cases := 0
	for v := int16(4); v <= kmsg.NewPtrFetchResponse().MaxVersion(); v++ {
		for range 10 {
			resp := kmsg.NewPtrFetchResponse()
			resp.Version, resp.SessionID = v, r.Int32()
			for ti := range 1 + r.IntN(3) {
				rt := kmsg.NewFetchResponseTopic()
				rt.Topic = string(rune('a' + ti))
				rt.TopicID[0] = byte(ti + 1)
				for p := range 1 + r.IntN(4) {
					rp := kmsg.NewFetchResponseTopicPartition()
					rp.Partition, rp.HighWatermark = int32(p), r.Int64()
					switch r.IntN(4) {
					case 0:
						rp.RecordBatches = make([]byte, spliceMinBytes+r.IntN(1000))
						rp.RecordBatches[0], rp.RecordBatches[len(rp.RecordBatches)-1] = byte(p+1), byte(ti+1)
					case 1:
						rp.RecordBatches = make([]byte, r.IntN(300))
					case 2:
						rp.RecordBatches = []byte{}
					}
					for range r.IntN(3) {
						a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
						a.ProducerID, a.FirstOffset = r.Int64(), r.Int64()
						rp.AbortedTransactions = append(rp.AbortedTransactions, a)
					}
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			whole := append(append(make([]byte, 4), header...), resp.AppendTo(nil)...)
			binary.BigEndian.PutUint32(whole, uint32(len(whole)-4))

			large := detachLarge(resp, nil)
			enc := append(append(make([]byte, 4), header...), resp.AppendTo(nil)...)
			if len(large) == 0 {
				if !bytes.Equal(enc[4:], whole[4:]) {
					t.Fatalf("v%d: nothing detached, yet the encoding differs", v)
				}
				continue
			}
			parts, err := spliceFrame(v, enc, 4+len(header), large)
			if err != nil {
				t.Fatalf("v%d: %v", v, err)
			}
			var got []byte
			for _, b := range parts.bufs {
				got = append(got, b...)
			}
			if !bytes.Equal(got, whole) {
				t.Fatalf("v%d: the frame in parts (%d bytes) is not the frame encoded whole (%d bytes)", v, len(got), len(whole))
			}
			reattach(large)
			if again := append(append(make([]byte, 4), header...), resp.AppendTo(nil)...); !bytes.Equal(again[4:], whole[4:]) {
				t.Fatalf("v%d: reattach did not restore the response", v)
			}
			cases++
		}
	}
	if cases == 0 {
		t.Fatal("no response had a large record set")
	}
	if _, err := spliceFrame(12, []byte{0, 0, 0, 1, 0}, 4, []detachedSet{{index: 0, set: []byte("x")}}); err == nil {
		t.Error("a body that does not walk: want an error")
	}
}
