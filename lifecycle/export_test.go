package lifecycle

import "time"

// ObjectName exports objectName to the tests.
var ObjectName = objectName

// Checkpoint and the checkpoint functions, for the tests.
type Checkpoint = checkpoint

func NewCheckpoint(t time.Time, offs map[int32]int64) Checkpoint {
	return checkpoint{Time: t, Offsets: offs}
}

func (c Checkpoint) Passed(logStart map[int32]int64) bool { return c.passed(logStart) }

var PruneCheckpoints = pruneCheckpoints

// Groups exports groups: partitions per reading client.
func Groups(spans map[int32][2]int64, workers int) [][]int32 {
	s := map[int32]span{}
	for p, se := range spans {
		s[p] = span{se[0], se[1]}
	}
	return groups(s, workers)
}

const MaxPendingCheckpoints = maxPendingCheckpoints
