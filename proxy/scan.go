package proxy

import (
	"errors"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// The shapes of the requests the proxy decodes with kmsg (Produce, and Fetch
// with fetch interceptors), counted first without allocating: decoded, each
// topic and partition is a struct many times larger than its bytes on the
// wire (a topic of a Fetch request is 2 bytes there, ~100 in memory), so the
// decoded size is charged to the memory budget before kmsg allocates it.

// errShape: a request that cannot be counted (it would not decode either).
var errShape = errors.New("malformed request body")

// decodedBytes is an upper bound of what kmsg allocates to decode a request
// with these many topics and partitions (and forgotten partitions, Fetch),
// beyond the bytes it keeps pointing into.
func decodedBytes(topics, partitions int64, key int16) int64 {
	switch key {
	case keyProduce:
		// The partitions, and the interceptors' work per partition.
		return topics*int64(unsafe.Sizeof(kmsg.ProduceRequestTopic{})) +
			partitions*(int64(unsafe.Sizeof(kmsg.ProduceRequestTopicPartition{}))+interceptor.DuplicateEntryBytes+interceptor.PartitionWorkBytes) + 1024
	default:
		// Fetch: the topics and partitions, and the limits the proxy keeps
		// per partition (map entries of FetchLimits).
		return topics*int64(unsafe.Sizeof(kmsg.FetchRequestTopic{})) +
			partitions*(int64(unsafe.Sizeof(kmsg.FetchRequestTopicPartition{}))+2*fetchLimitEntryBytes) + 1024
	}
}

// fetchLimitEntryBytes bounds one partition's entry in a FetchLimits map.
const fetchLimitEntryBytes = 96

// scanner reads a request body as kmsg would, counting arrays.
type scanner struct {
	b        kbin.Reader
	flexible bool
}

// arrayLen reads an array's length; a negative one (null, or any other
// negative int32, which kmsg decodes as an empty array) counts 0, so that
// no length can cancel the others out of the count.
func (s *scanner) arrayLen() int64 {
	var n int64
	if s.flexible {
		n = int64(s.b.CompactArrayLen())
	} else {
		n = int64(s.b.ArrayLen())
	}
	return max(n, 0)
}

// skip passes over a string or bytes field without copying it: an int16
// (strings) or int32 (bytes) length, or a compact unsigned varint length + 1
// in flexible versions; -1 (0 compact) is null.
func (s *scanner) skip(bytesField bool) {
	var n int
	switch {
	case s.flexible:
		n = int(s.b.Uvarint()) - 1
	case bytesField:
		n = int(s.b.Int32())
	default:
		n = int(s.b.Int16())
	}
	if n > 0 {
		s.b.Span(n)
	}
}

func (s *scanner) str()           { s.skip(false) }
func (s *scanner) nullableStr()   { s.skip(false) }
func (s *scanner) nullableBytes() { s.skip(true) }

func (s *scanner) tags() {
	if s.flexible {
		kmsg.SkipTags(&s.b)
	}
}

// produceShape counts the topics and partitions of a Produce request body.
func produceShape(version int16, body []byte, flexible bool) (topics, partitions int64, err error) {
	s := scanner{b: kbin.Reader{Src: body}, flexible: flexible}
	if version >= 3 {
		s.nullableStr() // transactional id
	}
	s.b.Int16() // acks
	s.b.Int32() // timeout
	topics = s.arrayLen()
	for t := int64(0); t < topics && s.b.Ok(); t++ {
		if version >= 13 {
			s.b.Uuid()
		} else {
			s.str()
		}
		n := s.arrayLen()
		partitions += n
		for p := int64(0); p < n && s.b.Ok(); p++ {
			s.b.Int32()
			s.nullableBytes()
			s.tags()
		}
		s.tags()
	}
	if !s.b.Ok() || topics < 0 {
		return 0, 0, errShape
	}
	return topics, partitions, nil
}

// fetchShape counts the topics and partitions (forgotten ones included) of
// a Fetch request body.
func fetchShape(version int16, body []byte, flexible bool) (topics, partitions int64, err error) {
	s := scanner{b: kbin.Reader{Src: body}, flexible: flexible}
	if version <= 14 {
		s.b.Int32() // replica id
	}
	s.b.Int32() // max wait
	s.b.Int32() // min bytes
	if version >= 3 {
		s.b.Int32() // max bytes
	}
	if version >= 4 {
		s.b.Int8() // isolation level
	}
	if version >= 7 {
		s.b.Int32() // session id
		s.b.Int32() // session epoch
	}
	topic := func(forgotten bool) {
		if version >= 13 {
			s.b.Uuid()
		} else {
			s.str()
		}
		n := s.arrayLen()
		partitions += n
		for p := int64(0); p < n && s.b.Ok(); p++ {
			s.b.Int32() // partition
			if forgotten {
				continue
			}
			if version >= 9 {
				s.b.Int32() // current leader epoch
			}
			s.b.Int64() // fetch offset
			if version >= 12 {
				s.b.Int32() // last fetched epoch
			}
			if version >= 5 {
				s.b.Int64() // log start offset
			}
			s.b.Int32() // partition max bytes
			s.tags()
		}
		s.tags()
	}
	n := s.arrayLen()
	topics += n
	for t := int64(0); t < n && s.b.Ok(); t++ {
		topic(false)
	}
	if version >= 7 {
		n := s.arrayLen()
		topics += n
		for t := int64(0); t < n && s.b.Ok(); t++ {
			topic(true)
		}
	}
	if !s.b.Ok() || topics < 0 {
		return 0, 0, errShape
	}
	return topics, partitions, nil
}

// namesBrokers reports whether a Produce (v9+) or Fetch (v12+) response
// body carries KIP-951 NodeEndpoints (its top-level tagged field 0), the
// only broker endpoints these responses have: a broker adds them when a
// partition's leader moved (NOT_LEADER_OR_FOLLOWER with the new leader).
// It walks the body as kmsg decodes it, without allocating, so a response
// that names no broker (nearly all) is forwarded as it came instead of
// being decoded. An error (a body that does not decode this way) sends the
// response through the full decode (RewriteResponse), which decides.
func namesBrokers(key, version int16, body []byte) (bool, error) {
	s := scanner{b: kbin.Reader{Src: body}, flexible: true}
	switch {
	case key == keyProduce && version >= produceFirstFlexible:
		topics := s.arrayLen()
		for t := int64(0); t < topics && s.b.Ok(); t++ {
			if version >= 13 {
				s.b.Uuid()
			} else {
				s.str()
			}
			n := s.arrayLen()
			for p := int64(0); p < n && s.b.Ok(); p++ {
				s.b.Int32() // partition
				s.b.Int16() // error code
				s.b.Int64() // base offset
				s.b.Int64() // log append time
				s.b.Int64() // log start offset
				errs := s.arrayLen()
				for e := int64(0); e < errs && s.b.Ok(); e++ {
					s.b.Int32() // relative offset
					s.nullableStr()
					s.tags()
				}
				s.nullableStr() // error message
				s.tags()        // current leader (tag 0) among them
			}
			s.tags()
		}
		s.b.Int32() // throttle
	case key == keyFetch && version >= fetchFirstFlexible:
		s.fetchResponse(version, nil)
	default:
		return false, errShape
	}
	if !s.b.Ok() {
		return false, errShape
	}
	// What is left is the response's tagged fields.
	found, err := namesNode(s.b.Src)
	if err != nil {
		return false, errShape
	}
	return found, nil
}

// fetchResponse walks a Fetch response body (v4+) as kmsg decodes it, up to
// its top-level tagged fields; records, when not nil, is given, for each
// partition's record set field in order, the bytes left in the body from
// that field on (its length first). It allocates nothing of its own.
func (s *scanner) fetchResponse(version int16, records func(left int)) {
	s.b.Int32() // throttle
	if version >= 7 {
		s.b.Int16() // error code
		s.b.Int32() // session id
	}
	topics := s.arrayLen()
	for t := int64(0); t < topics && s.b.Ok(); t++ {
		if version >= 13 {
			s.b.Uuid()
		} else {
			s.str()
		}
		n := s.arrayLen()
		for p := int64(0); p < n && s.b.Ok(); p++ {
			s.fetchPartitionHead(version)
			if records != nil {
				records(len(s.b.Src))
			}
			s.nullableBytes() // records
			s.tags()          // diverging epoch, current leader, snapshot id
		}
		s.tags()
	}
}

// topic reads a topic name (a string, compact in flexible versions) as a
// string over the body's bytes, or a topic id (v13+).
func (s *scanner) topic(version int16) (name string, id [16]byte) {
	switch {
	case version >= 13:
		id = s.b.Uuid()
	case s.flexible:
		name = s.b.UnsafeCompactString()
	default:
		name = s.b.UnsafeString()
	}
	return name, id
}

// fetchPartitionHead reads a Fetch response partition's fields before its
// records (kmsg.FetchResponseTopicPartition) and returns its error code.
func (s *scanner) fetchPartitionHead(version int16) int16 {
	s.b.Int32() // partition
	code := s.b.Int16()
	s.b.Int64() // high watermark
	s.b.Int64() // last stable offset
	if version >= 5 {
		s.b.Int64() // log start offset
	}
	aborted := s.arrayLen()
	for a := int64(0); a < aborted && s.b.Ok(); a++ {
		s.b.Int64() // producer id
		s.b.Int64() // first offset
		s.tags()
	}
	if version >= 11 {
		s.b.Int32() // preferred read replica
	}
	return code
}

// records reads a nullable bytes field (a record set) over the body's bytes.
func (s *scanner) records() []byte {
	if s.flexible {
		return s.b.CompactNullableBytes()
	}
	return s.b.NullableBytes()
}

// produceRecordSets appends to sets the record set of every partition of a
// Produce request body (v3+: magic v2 batches), read in place as kmsg
// decodes it, strings and record sets over body's bytes: what the chain
// skims (interceptor.Chain.ProduceUntouched) before it decodes anything.
// errShape: a body that does not read this way to its end (the full decode
// then decides).
func produceRecordSets(version int16, body []byte, flexible bool, sets []interceptor.RecordSet) ([]interceptor.RecordSet, error) {
	s := scanner{b: kbin.Reader{Src: body}, flexible: flexible}
	if version < 3 {
		return sets, errShape
	}
	s.nullableStr() // transactional id
	s.b.Int16()     // acks
	s.b.Int32()     // timeout
	topics := s.arrayLen()
	for t := int64(0); t < topics && s.b.Ok(); t++ {
		name, id := s.topic(version)
		n := s.arrayLen()
		for p := int64(0); p < n && s.b.Ok(); p++ {
			s.b.Int32() // partition
			sets = append(sets, interceptor.RecordSet{Topic: name, TopicID: id, Records: s.records()})
			s.tags()
		}
		s.tags()
	}
	s.tags()
	if err := s.b.Complete(); err != nil {
		return sets, errShape
	}
	return sets, nil
}

// fetchRecordSets appends to sets the record set of every partition of a
// Fetch response body (v4+) that has no error, read in place
// as kmsg decodes it (see produceRecordSets), and returns the response's
// session id (v7+; 0 before). errShape: a body that does not read this way
// to its end.
func fetchRecordSets(version int16, body []byte, sets []interceptor.RecordSet) ([]interceptor.RecordSet, int32, error) {
	if version < 4 {
		return sets, 0, errShape
	}
	s := scanner{b: kbin.Reader{Src: body}, flexible: version >= fetchFirstFlexible}
	s.b.Int32() // throttle
	var session int32
	if version >= 7 {
		s.b.Int16() // error code
		session = s.b.Int32()
	}
	topics := s.arrayLen()
	for t := int64(0); t < topics && s.b.Ok(); t++ {
		name, id := s.topic(version)
		n := s.arrayLen()
		for p := int64(0); p < n && s.b.Ok(); p++ {
			code := s.fetchPartitionHead(version)
			recs := s.records()
			if code == 0 { // (the chain leaves the others as they are)
				sets = append(sets, interceptor.RecordSet{Topic: name, TopicID: id, Records: recs})
			}
			s.tags() // diverging epoch, current leader, snapshot id
		}
		s.tags()
	}
	s.tags()
	if err := s.b.Complete(); err != nil {
		return sets, 0, errShape
	}
	return sets, session, nil
}

// produceTooLarge reports whether a Produce response body (v3+) refuses a
// partition with MESSAGE_TOO_LARGE (the proxy then forgets the topic's
// cached max.message.bytes), walking it as kmsg decodes it without
// allocating. errShape: a body that does not read this way to its end.
func produceTooLarge(version int16, body []byte) (bool, error) {
	if version < 3 {
		return false, errShape
	}
	s := scanner{b: kbin.Reader{Src: body}, flexible: version >= produceFirstFlexible}
	found := false
	topics := s.arrayLen()
	for t := int64(0); t < topics && s.b.Ok(); t++ {
		s.topic(version)
		n := s.arrayLen()
		for p := int64(0); p < n && s.b.Ok(); p++ {
			s.b.Int32() // partition
			if s.b.Int16() == kerr.MessageTooLarge.Code {
				found = true
			}
			s.b.Int64() // base offset
			s.b.Int64() // log append time
			if version >= 5 {
				s.b.Int64() // log start offset
			}
			if version >= 8 {
				errs := s.arrayLen()
				for e := int64(0); e < errs && s.b.Ok(); e++ {
					s.b.Int32() // batch index
					s.nullableStr()
					s.tags()
				}
				s.nullableStr() // error message
			}
			s.tags()
		}
		s.tags()
	}
	s.b.Int32() // throttle
	s.tags()
	if err := s.b.Complete(); err != nil {
		return false, errShape
	}
	return found, nil
}
