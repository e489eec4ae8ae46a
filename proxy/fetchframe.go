package proxy

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A rewritten Fetch response whose partitions hold large record sets (a
// payload put back by large-message) is written without copying those sets
// into the frame: they are detached (set to null) before the response is
// encoded, and the frame goes out as a vector (writev) of the encoded bytes
// with each set put back where its null was. A 100 MiB record is then held
// once by the response, not twice.

// spliceMinBytes: record sets at least this large are written from where
// they lie.
const spliceMinBytes = 256 << 10

// detachedSet is a partition's record set taken out before encoding.
type detachedSet struct {
	p     *kmsg.FetchResponseTopicPartition
	index int // the partition's place in the response, counting every partition in order
	set   []byte
}

// detachLarge takes the large record sets out of resp (nulling them); put
// them back with reattach.
func detachLarge(resp *kmsg.FetchResponse) []detachedSet {
	var ds []detachedSet
	i := 0
	for ti := range resp.Topics {
		for pi := range resp.Topics[ti].Partitions {
			p := &resp.Topics[ti].Partitions[pi]
			if len(p.RecordBatches) >= spliceMinBytes {
				ds = append(ds, detachedSet{p: p, index: i, set: p.RecordBatches})
				p.RecordBatches = nil
			}
			i++
		}
	}
	return ds
}

func reattach(ds []detachedSet) {
	for _, d := range ds {
		d.p.RecordBatches = d.set
	}
}

// spliceFrame returns the frame enc (a size prefix, the response header,
// then the body from bodyStart, encoded with ds detached) as a vector with
// each detached set in its partition's place, and the frame's size prefix
// set for the whole. Errors: the body does not walk as a Fetch response of
// version (a bug: the caller encodes it whole instead).
func spliceFrame(version int16, enc []byte, bodyStart int, ds []detachedSet) (net.Buffers, error) {
	offs, err := fetchRecordsFields(version, enc[bodyStart:])
	if err != nil {
		return nil, err
	}
	flexible := version >= 12
	parts := make(net.Buffers, 0, 3*len(ds)+1)
	prev, size := 0, 0
	for _, d := range ds {
		if d.index >= len(offs) {
			return nil, fmt.Errorf("partition %d of a Fetch v%d response not found", d.index, version)
		}
		at := bodyStart + offs[d.index]
		var null, length []byte
		if flexible {
			null, length = []byte{0}, kbin.AppendUvarint(nil, uint32(len(d.set)+1))
		} else {
			null, length = []byte{0xff, 0xff, 0xff, 0xff}, kbin.AppendInt32(nil, int32(len(d.set)))
		}
		if at+len(null) > len(enc) || string(enc[at:at+len(null)]) != string(null) {
			return nil, fmt.Errorf("partition %d of a Fetch v%d response: its record set is not the null put there", d.index, version)
		}
		parts = append(parts, enc[prev:at], length, d.set)
		size += at - prev + len(length) + len(d.set)
		prev = at + len(null)
	}
	parts = append(parts, enc[prev:])
	size += len(enc) - prev
	binary.BigEndian.PutUint32(enc, uint32(size-4))
	return parts, nil
}

// fetchRecordsFields returns the offset in body of each partition's record
// set field (its length first), in order, walking the body as kmsg decodes
// a Fetch response of version (v4+).
func fetchRecordsFields(version int16, body []byte) ([]int, error) {
	if version < 4 {
		return nil, errShape
	}
	s := scanner{b: kbin.Reader{Src: body}, flexible: version >= 12}
	var offs []int
	s.fetchResponse(version, func(left int) { offs = append(offs, len(body)-left) })
	s.tags()
	if err := s.b.Complete(); err != nil {
		return nil, errShape
	}
	return offs, nil
}
