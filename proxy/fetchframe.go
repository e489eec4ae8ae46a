package proxy

import (
	"encoding/binary"
	"fmt"
	"math"
	"net"

	"github.com/ferrykit/ferry/interceptor"

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
	// holes are the set's streamed values (interceptor/stream.go), in
	// order: their bytes are not in set.
	holes []*interceptor.Hole
}

// detachLarge takes the large record sets, and those holding streamed
// values (streamed), out of resp (nulling them); put them back with
// reattach.
func detachLarge(resp *kmsg.FetchResponse, streamed []interceptor.StreamedSet) []detachedSet {
	holes := map[*kmsg.FetchResponseTopicPartition][]*interceptor.Hole{}
	for _, s := range streamed {
		holes[s.Partition] = s.Holes
	}
	var ds []detachedSet
	i := 0
	for ti := range resp.Topics {
		for pi := range resp.Topics[ti].Partitions {
			p := &resp.Topics[ti].Partitions[pi]
			hs := holes[p]
			if len(p.RecordBatches) >= spliceMinBytes || len(hs) > 0 && len(p.RecordBatches) > 0 {
				ds = append(ds, detachedSet{p: p, index: i, set: p.RecordBatches, holes: hs})
				p.RecordBatches = nil
			}
			i++
		}
	}
	return ds
}

// hasHoles reports whether any of ds holds a streamed value.
func hasHoles(ds []detachedSet) bool {
	for _, d := range ds {
		if len(d.holes) > 0 {
			return true
		}
	}
	return false
}

func reattach(ds []detachedSet) {
	for _, d := range ds {
		d.p.RecordBatches = d.set
	}
}

// framePlan is a response frame as a vector: bufs written in order, and
// before bufs[i] the streamed value holes[i], if any.
type framePlan struct {
	bufs  net.Buffers
	holes map[int]*interceptor.Hole
}

// spliceFrame returns the frame enc (a size prefix, the response header,
// then the body from bodyStart, encoded with ds detached) as a vector with
// each detached set in its partition's place (its streamed values in their
// holes), and the frame's size prefix set for the whole. Errors: the body
// does not walk as a Fetch response of version (a bug), or the frame would
// be over 2 GiB with its streamed values.
func spliceFrame(version int16, enc []byte, bodyStart int, ds []detachedSet) (framePlan, error) {
	offs, err := fetchRecordsFields(version, enc[bodyStart:])
	if err != nil {
		return framePlan{}, err
	}
	flexible := version >= 12
	fp := framePlan{bufs: make(net.Buffers, 0, 3*len(ds)+1)}
	prev, size := 0, int64(0)
	for _, d := range ds {
		if d.index >= len(offs) {
			return framePlan{}, fmt.Errorf("partition %d of a Fetch v%d response not found", d.index, version)
		}
		at := bodyStart + offs[d.index]
		setLen := int64(len(d.set))
		for _, h := range d.holes {
			setLen += h.Size
		}
		if setLen > math.MaxInt32-1 {
			return framePlan{}, fmt.Errorf("partition %d of a Fetch v%d response: its record set would be %d bytes with its streamed values", d.index, version, setLen)
		}
		var null, length []byte
		if flexible {
			null, length = []byte{0}, kbin.AppendUvarint(nil, uint32(setLen+1))
		} else {
			null, length = []byte{0xff, 0xff, 0xff, 0xff}, kbin.AppendInt32(nil, int32(setLen))
		}
		if at+len(null) > len(enc) || string(enc[at:at+len(null)]) != string(null) {
			return framePlan{}, fmt.Errorf("partition %d of a Fetch v%d response: its record set is not the null put there", d.index, version)
		}
		fp.bufs = append(fp.bufs, enc[prev:at], length)
		from := int64(0)
		for _, h := range d.holes {
			if h.At < from || h.At > int64(len(d.set)) {
				return framePlan{}, fmt.Errorf("partition %d of a Fetch v%d response: a streamed value at byte %d lies outside its record set", d.index, version, h.At)
			}
			fp.bufs = append(fp.bufs, d.set[from:h.At])
			if fp.holes == nil {
				fp.holes = map[int]*interceptor.Hole{}
			}
			fp.holes[len(fp.bufs)] = h
			from = h.At
		}
		fp.bufs = append(fp.bufs, d.set[from:])
		size += int64(at-prev+len(length)) + setLen
		prev = at + len(null)
	}
	fp.bufs = append(fp.bufs, enc[prev:])
	size += int64(len(enc) - prev)
	if size-4 > math.MaxInt32 {
		return framePlan{}, fmt.Errorf("a Fetch v%d response would be %d bytes with its streamed values", version, size)
	}
	binary.BigEndian.PutUint32(enc, uint32(size-4))
	return fp, nil
}

// size is the frame's length in bytes, streamed values included.
func (fp framePlan) size() int64 {
	var n int64
	for _, b := range fp.bufs {
		n += int64(len(b))
	}
	for _, h := range fp.holes {
		n += h.Size
	}
	return n
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
