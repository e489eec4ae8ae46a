package lifecycle

import (
	"context"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// bounds returns each partition's span for the full read: from its log
// start offset to its last stable offset.
func bounds(ctx context.Context, adm *kadm.Client, topic string) (map[int32]span, error) {
	starts, err := listOffsets(ctx, topic, "start offsets", adm.ListStartOffsets)
	if err != nil {
		return nil, err
	}
	ends, err := listOffsets(ctx, topic, "last stable offsets", adm.ListCommittedOffsets)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]span, len(ends))
	for p, end := range ends {
		start, ok := starts[p]
		if !ok {
			return nil, fmt.Errorf("gc: topic %s partition %d: no start offset listed", topic, p)
		}
		out[p] = span{start: start, end: end}
	}
	return out, nil
}

// pkey is a record key within one partition (compaction is per partition).
type pkey struct {
	partition int32
	key       string
}

// collector gathers the live references of the records one reading group
// sees: every key reference, and every value reference (delete policy) or
// the value reference of the latest record per key (compacted). Groups read
// disjoint partitions, so their latest maps never share a key.
type collector struct {
	compacted bool
	live      map[string]struct{}
	latest    map[pkey]string // compacted: the latest value reference per key ("" for none)
}

// readLive reads every partition of topic from its start to its last stable
// offset, workers partitions groups in parallel, and returns the set of
// live object names (objectName), the number of records read and the end
// offsets read to. It reads with read_uncommitted: a record of an aborted
// transaction stays in the log, and a read_uncommitted consumer (Kafka's
// default isolation.level) reads it, so its payloads are live as long as
// the record is there (the collector decides how, for compacted topics).
func readLive(ctx context.Context, cl *kgo.Client, adm *kadm.Client, topic string, compacted bool, workers int, progress func(int64)) (map[string]struct{}, int64, offsets, error) {
	spans, err := bounds(ctx, adm, topic)
	if err != nil {
		return nil, 0, nil, err
	}
	end := make(offsets, len(spans))
	for p, sp := range spans {
		end[p] = sp.end
	}
	gs := groups(spans, workers)
	cols := make([]*collector, len(gs))
	for i := range cols {
		cols[i] = &collector{compacted: compacted, live: map[string]struct{}{}, latest: map[pkey]string{}}
	}
	n, err := readGroups(ctx, cl, topic, spans, gs, func(g int, r *kgo.Record) error { return cols[g].add(r) }, progress)
	if err != nil {
		return nil, n, nil, err
	}
	live := make(map[string]struct{})
	for _, c := range cols {
		for name := range c.live {
			live[name] = struct{}{}
		}
		for _, path := range c.latest {
			if path != "" {
				live[objectName(path)] = struct{}{}
			}
		}
	}
	return live, n, end, nil
}

// objectName is the part of a full path that names the object within any
// store: its payload key, "<topic>/<shard>/<id>" (or "<topic>/<id>", the
// layout before shards; payloadstore.PathKey), else its last three segments
// (docs/FORMAT.md).
// Live references and listed objects are matched on it rather than on the
// whole path, so that a reference written through another spelling of the
// same store's root (a file store mounted at another directory, a bucket
// reached through another endpoint) still keeps its object. A reference into
// another store can at worst keep an object with the same name here; it
// never makes one deletable.
func objectName(fullPath string) string {
	if kp, err := payloadstore.PathKey(fullPath); err == nil {
		if kp.Shard == "" {
			return kp.Topic + "/" + kp.ID
		}
		return kp.Topic + "/" + kp.Shard + "/" + kp.ID
	}
	i := len(fullPath)
	for range 3 {
		j := strings.LastIndexByte(fullPath[:i], '/')
		if j < 0 {
			return fullPath
		}
		i = j
	}
	return fullPath[i+1:]
}

// add adds the references of r to live (its key reference, and its value
// reference unless compacted) or to latest (compacted: the value reference
// of the latest record per key). In a compacted topic a transactional
// record's value reference is live while the record is in the log: read
// with read_uncommitted, it may belong to an aborted transaction, which
// must neither replace the latest committed record of its key (Kafka's log
// cleaner removes aborted records and keeps that one) nor lose its payload
// while read_uncommitted consumers can still read it.
func (c *collector) add(r *kgo.Record) error {
	keyPath, valuePath, err := references(r)
	if err != nil {
		return err
	}
	if keyPath != "" {
		c.live[objectName(keyPath)] = struct{}{}
	}
	if c.compacted && r.Key != nil && !r.Attrs.IsTransactional() {
		// A later record of the key replaces this one; a tombstone
		// (nil value) or an inline value holds no payload.
		c.latest[pkey{r.Partition, string(r.Key)}] = valuePath
		return nil
	}
	if valuePath != "" {
		c.live[objectName(valuePath)] = struct{}{}
	}
	return nil
}

// references returns the full paths r's key and value references name (""
// for a side that is not offloaded). A side marked offloaded whose bytes do
// not decode is an error naming the record (wrapping
// largemessage.ErrCorruptReference).
func references(r *kgo.Record) (keyPath, valuePath string, err error) {
	if largemessage.IsKeyOffloaded(r) {
		ref, err := largemessage.DecodeReference(r.Key)
		if err != nil {
			return "", "", corrupt(r, "key", err)
		}
		keyPath = ref.FullPayloadPath
	}
	if largemessage.IsOffloaded(r) {
		ref, err := largemessage.DecodeReference(r.Value)
		if err != nil {
			return "", "", corrupt(r, "value", err)
		}
		valuePath = ref.FullPayloadPath
	}
	return keyPath, valuePath, nil
}

func corrupt(r *kgo.Record, side string, err error) error {
	return fmt.Errorf("gc: topic %s partition %d offset %d: %s: %w", r.Topic, r.Partition, r.Offset, side, err)
}
