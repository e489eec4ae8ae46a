package interceptor

import (
	"context"
	"encoding/binary"
	"regexp"
	"slices"

	"github.com/twmb/franz-go/pkg/kbin"

	"github.com/ferrykit/ferry/largemessage"
)

// A skim reads a request's or response's record sets in place, without
// decoding them, to find whether any record could need the chain: when
// none does, the proxy passes the frame on as its bytes (issue 19: the
// chain's cost when it has nothing to do). It decides "untouched" only
// when it is sure; anything it cannot read cleanly, or any batch it
// cannot see into (compressed, another magic), goes through the chain,
// which then refuses or handles it as before.

// RecordSet is one partition's records field as a skim reads it in place:
// of a Produce request or a Fetch response, its topic named by name
// (versions before 13) or by id (13+).
type RecordSet struct {
	Topic   string
	TopicID [16]byte
	Records []byte
}

// batch header fields (magic v2) the skim reads
const (
	producerIDOffset    = 43
	producerEpochOffset = 51
	numRecordsOffset    = 57
)

// ProduceUntouched reports whether InterceptProduce would forward every
// record set of sets (the record sets of one Produce request) exactly as
// it came, with nothing published, deferred or refused: for each set,
// either no interceptor matches its topic, or every one that does is a
// Skimmer that may act on none of its records, and then the topic exists
// (limits does not say Missing), every batch is a magic v2 batch whose
// lengths and record counts agree with its bytes, is uncompressed (or a
// control batch) and fits the topic's max.message.bytes as the broker
// stores it. limits is InterceptProduce's, asked once for the matching
// topics with ctx (the request's: a lookup of the cluster ends with it). A topic named by an id the chain cannot name is not untouched
// (InterceptProduce refuses it).
//
// The CRC-32C is not checked: nothing is published or changed for a
// request the skim passes, and the broker checks every batch's CRC before
// it appends anything (CORRUPT_MESSAGE), as for a request through the
// plain proxy. The chain checks it where it acts on the batch's bytes.
func (c *Chain) ProduceUntouched(ctx context.Context, sets []RecordSet, limits func(ctx context.Context, topics []string) map[string]TopicLimit) bool {
	if len(c.produce) == 0 {
		return true
	}
	var matching []string
	sk := skimCache{c: c}
	for i := range sets {
		name, skimmers, ok := sk.of(&sets[i])
		if !ok {
			return false
		}
		if len(skimmers) > 0 && !slices.Contains(matching, name) {
			matching = append(matching, name)
		}
	}
	if len(matching) == 0 {
		return true
	}
	var lims map[string]TopicLimit
	if limits != nil {
		lims = limits(ctx, matching)
	}
	for i := range sets {
		name, skimmers, _ := sk.of(&sets[i])
		if len(skimmers) == 0 {
			continue
		}
		lim := lims[name]
		if lim.Missing || !skimSet(sets[i].Records, skimmers, lim, false) {
			return false
		}
	}
	return true
}

// FetchUntouched reports whether InterceptFetchLimited would leave every
// record set of sets (those of one Fetch response with no partition
// error; the caller passes the others on as they are) exactly as it came:
// for each, no interceptor matches its topic, or every one that does is a
// Skimmer that may act on none of its records, which are in magic v2
// batches, uncompressed or control, whose lengths and counts agree with
// their bytes. A trailing partial batch (the broker cuts a record set at
// the consumer's limit) is read up to its last whole record, which must
// pass too: its cut record can be read by no client. (The chain leaves
// such a batch out; passed on, consumers drop it as they do from the
// broker.) The CRC is not checked: nothing is changed, and consumers check
// it (check.crcs).
func (c *Chain) FetchUntouched(sets []RecordSet) bool {
	if len(c.fetch) == 0 {
		return true
	}
	sk := skimCache{c: c, fetch: true}
	for i := range sets {
		_, skimmers, ok := sk.of(&sets[i])
		if !ok {
			return false
		}
		if len(skimmers) > 0 && !skimSet(sets[i].Records, skimmers, TopicLimit{}, true) {
			return false
		}
	}
	return true
}

// skimEntry is a topic's skimmers (none: no interceptor matches it); ok
// false: an interceptor matching it is no Skimmer.
type skimEntry struct {
	skimmers []Skimmer
	ok       bool
}

// maxSkimTopics bounds the topics whose skimmers a chain remembers (topic
// names come from clients): past it, the memory starts again.
const maxSkimTopics = 4096

// skimmersOf returns the skimmers of the interceptors of one side matching
// topic, remembered per chain.
func (c *Chain) skimmersOf(topic string, fetch bool) skimEntry {
	side := 0
	if fetch {
		side = 1
	}
	c.skimMu.Lock()
	e, found := c.skimTopics[side][topic]
	c.skimMu.Unlock()
	if found {
		return e
	}
	e.ok = true
	add := func(ic interface{ TopicPattern() *regexp.Regexp }) {
		if !e.ok || !ic.TopicPattern().MatchString(topic) {
			return
		}
		sk, ok := ic.(Skimmer)
		e.skimmers, e.ok = append(e.skimmers, sk), ok
	}
	if fetch {
		for _, ic := range c.fetch {
			add(ic)
		}
	} else {
		for _, ic := range c.produce {
			add(ic)
		}
	}
	if !e.ok {
		e.skimmers = nil
	}
	c.skimMu.Lock()
	if c.skimTopics[side] == nil || len(c.skimTopics[side]) >= maxSkimTopics {
		c.skimTopics[side] = map[string]skimEntry{}
	}
	c.skimTopics[side][topic] = e
	c.skimMu.Unlock()
	return e
}

// skimCache resolves the skimmers of a request's topics, remembering the
// last topic (a request lists each topic's partitions together).
type skimCache struct {
	c     *Chain
	fetch bool
	// the last topic asked for, as the set names it, and what of gave
	set   bool
	topic string
	id    [16]byte
	name  string
	e     skimEntry
}

// of returns the set's topic name and the skimmers of the interceptors
// matching it (none: no interceptor matches); ok false: an interceptor
// matching it is no Skimmer, or the topic cannot be named.
func (s *skimCache) of(rs *RecordSet) (string, []Skimmer, bool) {
	if s.set && rs.Topic == s.topic && rs.TopicID == s.id {
		return s.name, s.e.skimmers, s.e.ok
	}
	s.set, s.topic, s.id = true, rs.Topic, rs.TopicID
	var named bool
	s.name, named = s.c.topicName(rs.Topic, rs.TopicID)
	s.e = skimEntry{}
	if named {
		s.e = s.c.skimmersOf(s.name, s.fetch)
	}
	return s.name, s.e.skimmers, s.e.ok
}

// maxSkimmers is how many skimmers' answers a batch's skim holds without
// allocating.
const maxSkimmers = 4

// skimSet reads the batches of one record set (see ProduceUntouched and
// FetchUntouched) and reports whether none of the skimmers may act on any
// of their records. fetch: a trailing partial batch is allowed (read up to
// its last whole record); lim is the topic's, on produce.
func skimSet(set []byte, skimmers []Skimmer, lim TopicLimit, fetch bool) bool {
	for len(set) > 0 {
		raw, rest, complete := splitBatch(set)
		partial := false
		if !complete {
			if !fetch {
				return false
			}
			raw, rest, partial = set, nil, true
			if len(raw) < batchHeaderLen {
				// Not even a header: no record of it can be read.
				return len(raw) <= magicOffset || raw[magicOffset] == 2
			}
		}
		set = rest
		if len(raw) < batchHeaderLen || raw[magicOffset] != 2 {
			return false
		}
		attrs := int16(binary.BigEndian.Uint16(raw[attrOffset:]))
		if attrs&attrCodecMask != 0 {
			return false // compressed: only the chain sees into it
		}
		n := int32(binary.BigEndian.Uint32(raw[numRecordsOffset:]))
		if attrs&attrControl != 0 {
			// Transaction markers: no interceptor sees them, but the
			// chain reads them, and refuses them when they do not read.
			if !skimRecords(raw[batchHeaderLen:], n, nil, partial) {
				return false
			}
			continue
		}
		info := BatchInfo{Compression: "none", ProducerID: int64(binary.BigEndian.Uint64(raw[producerIDOffset:])),
			ProducerEpoch: int16(binary.BigEndian.Uint16(raw[producerEpochOffset:])),
			Transactional: attrs&attrTransactional != 0, MaxMessageBytes: lim.MaxMessageBytes, TopicCompression: lim.Compression}
		if !fetch && lim.over(largemessage.StoredBatchSize(lim.Compression, "none", int64(len(raw)), int64(len(raw)-batchHeaderLen))) {
			return false // the chain refuses it, or a BatchShrinker makes it fit
		}
		var buf [maxSkimmers]Skim
		specs := buf[:0]
		for _, s := range skimmers {
			sp, ok := s.Skim(info)
			if !ok {
				return false
			}
			specs = append(specs, sp)
		}
		if !skimRecords(raw[batchHeaderLen:], n, specs, partial) {
			return false
		}
	}
	return true
}

// skimRecords reads n records of an uncompressed records section as the
// broker does (each record's fields fill exactly its length; the records
// fill exactly the section; no negative length but a null key, value or
// header value) and reports whether none is one specs may act on. partial:
// the section is cut; the records that are whole are read, and the cut one
// is ignored.
func skimRecords(src []byte, n int32, specs []Skim, partial bool) bool {
	if n < 0 {
		return false
	}
	for i := int32(0); i < n; i++ {
		ln, vl := kbin.Varint(src)
		if partial && (vl <= 0 || int64(vl)+int64(ln) > int64(len(src))) {
			return ln > 0 || vl == 0 // the cut record: no client reads it
		}
		if vl <= 0 || ln <= 0 || int64(vl)+int64(ln) > int64(len(src)) {
			return false
		}
		size := int64(vl) + int64(ln)
		for _, sp := range specs {
			if sp.MaxRecordBytes >= 0 && size > sp.MaxRecordBytes {
				return false
			}
		}
		if !skimRecord(src[vl:vl+int(ln)], specs) {
			return false
		}
		src = src[vl+int(ln):]
	}
	return len(src) == 0
}

// skimRecord reads one record's body (after its length) and reports
// whether it reads cleanly and carries no header specs name.
func skimRecord(b []byte, specs []Skim) bool {
	b, ok := skipN(b, 1) // attributes
	if !ok {
		return false
	}
	if b, ok = skipVarlong(b); !ok { // timestamp delta
		return false
	}
	if b, ok = skipVarint(b); !ok { // offset delta
		return false
	}
	if b, ok = skipBytes(b, true); !ok { // key
		return false
	}
	if b, ok = skipBytes(b, true); !ok { // value
		return false
	}
	nh, vl := kbin.Varint(b)
	if vl <= 0 || nh < 0 || int64(nh) > int64(len(b)) {
		return false
	}
	b = b[vl:]
	for range nh {
		kl, vl := kbin.Varint(b)
		if vl <= 0 || kl < 0 || int64(vl)+int64(kl) > int64(len(b)) {
			return false
		}
		key := b[vl : vl+int(kl)]
		for _, sp := range specs {
			for _, name := range sp.Headers {
				if string(key) == name {
					return false
				}
			}
		}
		if b, ok = skipBytes(b[vl+int(kl):], true); !ok {
			return false
		}
	}
	return len(b) == 0
}

func skipN(b []byte, n int) ([]byte, bool) {
	if len(b) < n {
		return nil, false
	}
	return b[n:], true
}

func skipVarint(b []byte) ([]byte, bool) {
	_, n := kbin.Varint(b)
	if n <= 0 { // cut, or longer than 5 bytes (kbin returns -5)
		return nil, false
	}
	return b[n:], true
}

func skipVarlong(b []byte) ([]byte, bool) {
	_, n := kbin.Varlong(b)
	if n <= 0 { // cut, or longer than 10 bytes (kbin returns -10)
		return nil, false
	}
	return b[n:], true
}

// skipBytes passes over a varint-length field; -1 is null when nullable.
func skipBytes(b []byte, nullable bool) ([]byte, bool) {
	l, n := kbin.Varint(b)
	if n <= 0 || l < -1 || l == -1 && !nullable || int64(n)+int64(max(l, 0)) > int64(len(b)) {
		return nil, false
	}
	return b[n+int(max(l, 0)):], true
}
