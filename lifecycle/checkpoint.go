package lifecycle

import (
	"context"
	"errors"
	"slices"
	"time"
)

// checkpointsKey is the key, under the topic's gc prefix, of the object that
// holds the topic's checkpoints.
const checkpointsKey = "checkpoints"

// maxPendingCheckpoints bounds the checkpoints kept that retention has not
// passed yet; beyond it the closest in time are thinned out (which only
// delays collection, never makes it unsafe).
const maxPendingCheckpoints = 64

// checkpointFile is the JSON object at <topic>/.ferry-gc/checkpoints.
type checkpointFile struct {
	Version int    `json:"version"`
	Topic   string `json:"topic"`
	// TopicID is the topic's id when the checkpoints were taken; a topic
	// deleted and created again under the same name starts over.
	TopicID     string       `json:"topic_id,omitempty"`
	Checkpoints []checkpoint `json:"checkpoints"`
}

// A checkpoint records that every record acknowledged before Time (gc's
// clock) lies below Offsets: it was taken by reading the clock, then the
// partitions' high watermarks. Once every partition's log start offset has
// reached its offset here, every such record has been deleted by
// retention: an object whose ModTime is at least the grace period older than
// Time can no longer be referenced by any record in the log.
type checkpoint struct {
	Time    time.Time       `json:"time"`
	Offsets map[int32]int64 `json:"offsets"`
}

// passed reports whether retention has deleted every record below c: each
// partition's log start offset is at least c's offset (a partition c does
// not name counts as offset 0; one logStart does not name fails).
func (c checkpoint) passed(logStart map[int32]int64) bool {
	for p, off := range c.Offsets {
		ls, ok := logStart[p]
		if !ok || ls < off {
			return false
		}
	}
	return true
}

// newestPassed returns the newest checkpoint retention has passed.
func newestPassed(cps []checkpoint, logStart map[int32]int64) (checkpoint, bool) {
	var best checkpoint
	found := false
	for _, c := range cps {
		if c.passed(logStart) && (!found || c.Time.After(best.Time)) {
			best, found = c, true
		}
	}
	return best, found
}

// pruneCheckpoints keeps the newest checkpoint retention has passed and all
// that it has not passed (at most maxPendingCheckpoints of those, thinned
// where they lie closest in time), sorted by time.
func pruneCheckpoints(cps []checkpoint, logStart map[int32]int64) []checkpoint {
	var out []checkpoint
	if best, ok := newestPassed(cps, logStart); ok {
		out = append(out, best)
	}
	var pending []checkpoint
	for _, c := range cps {
		if !c.passed(logStart) {
			pending = append(pending, c)
		}
	}
	slices.SortFunc(pending, func(a, b checkpoint) int { return a.Time.Compare(b.Time) })
	for len(pending) > maxPendingCheckpoints {
		// Drop the checkpoint closest to its predecessor, never the newest.
		drop, gap := 1, time.Duration(-1)
		for i := 1; i < len(pending)-1; i++ {
			if d := pending[i].Time.Sub(pending[i-1].Time); gap < 0 || d < gap {
				drop, gap = i, d
			}
		}
		pending = slices.Delete(pending, drop, drop+1)
	}
	out = append(out, pending...)
	slices.SortFunc(out, func(a, b checkpoint) int { return a.Time.Compare(b.Time) })
	return out
}

// loadCheckpoints reads the topic's checkpoints; those of another
// incarnation of the topic (another topic id) are dropped, and so is an
// object that does not decode (the run then overwrites it).
func (g *gcStore) loadCheckpoints(ctx context.Context, topicID string) ([]checkpoint, error) {
	var f checkpointFile
	found, err := g.get(ctx, checkpointsKey, &f)
	if errors.Is(err, errUnreadable) {
		return nil, nil // start over: checkpoints only ever allow deleting
	}
	if err != nil || !found {
		return nil, err
	}
	if f.Topic != g.topic || (f.TopicID != "" && topicID != "" && f.TopicID != topicID) {
		return nil, nil
	}
	return f.Checkpoints, nil
}

func (g *gcStore) saveCheckpoints(ctx context.Context, topicID string, cps []checkpoint) error {
	return g.put(ctx, checkpointsKey, checkpointFile{Version: 1, Topic: g.topic, TopicID: topicID, Checkpoints: cps})
}
