package proxy

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// fetchSessions follows a client connection's incremental fetch sessions
// (KIP-227), so that the fetch interceptors know every partition's fetch
// offset and partition_max_bytes even when an incremental Fetch request
// leaves out the partitions that did not change (Java and franz-go do).
//
// A full request with epoch 0 opens a session whose id the broker's
// response gives; a request with a positive epoch updates the session it
// names (partitions added or changed, forgotten ones removed); epoch -1 is
// sessionless (and closes the session it names). The state is charged to
// the memory budget (one entry per partition); a session whose state
// cannot be kept is forgotten, and its requests are then limited by what
// they carry (the response's max_bytes always).
type fetchSessions struct {
	mu       sync.Mutex
	s        *Server
	byID     map[int32]*fetchSession
	order    []int32 // ids, oldest first
	children int64   // bytes charged for all sessions
}

type fetchSession struct {
	parts map[interceptor.FetchPartition]partLimit
}

type partLimit struct {
	offset int64
	max    int32
}

// Bounds of the session state of one connection.
const (
	maxSessionsPerConn      = 4
	maxPartitionsPerSession = 100_000
	sessionEntryBytes       = 128
)

// limits returns the limits of req, merged with its session's, and
// records what req changes. pending is the state of a session req opens
// (epoch 0), to be bound to the id the response gives (opened).
func (fs *fetchSessions) limits(req *kmsg.FetchRequest) (interceptor.FetchLimits, *fetchSession) {
	l := interceptor.FetchLimitsOf(req)
	if req.Version < 7 {
		return l, nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	switch {
	case req.SessionEpoch == -1:
		fs.drop(req.SessionID)
		return l, nil
	case req.SessionEpoch == 0:
		fs.drop(req.SessionID)
		st := &fetchSession{parts: map[interceptor.FetchPartition]partLimit{}}
		for k, off := range l.FetchOffset {
			st.parts[k] = partLimit{offset: off, max: l.PartitionMaxBytes[k]}
		}
		return l, st
	}
	st := fs.byID[req.SessionID]
	if st == nil {
		return l, nil
	}
	for k, off := range l.FetchOffset {
		if _, known := st.parts[k]; !known && !fs.grow(1) {
			fs.drop(req.SessionID)
			return l, nil
		}
		st.parts[k] = partLimit{offset: off, max: l.PartitionMaxBytes[k]}
	}
	for _, t := range req.ForgottenTopics {
		for _, p := range t.Partitions {
			k := interceptor.FetchPartition{Topic: t.Topic, TopicID: t.TopicID, Partition: p}
			if _, known := st.parts[k]; known {
				delete(st.parts, k)
				fs.shrink(1)
			}
		}
	}
	for k, pl := range st.parts {
		l.FetchOffset[k] = pl.offset
		l.PartitionMaxBytes[k] = pl.max
	}
	return l, nil
}

// opened binds the state of a session a request opened to the id the
// broker gave it (0: none was opened).
func (fs *fetchSessions) opened(id int32, st *fetchSession) {
	if st == nil || id == 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.drop(id)
	if len(st.parts) > maxPartitionsPerSession || !fs.grow(int64(len(st.parts))) {
		return
	}
	if len(fs.order) >= maxSessionsPerConn {
		fs.drop(fs.order[0])
	}
	if fs.byID == nil {
		fs.byID = map[int32]*fetchSession{}
	}
	fs.byID[id] = st
	fs.order = append(fs.order, id)
}

// grow charges n more entries; false when the budget has no room now.
func (fs *fetchSessions) grow(n int64) bool {
	if fs.children/sessionEntryBytes+n > maxSessionsPerConn*maxPartitionsPerSession {
		return false
	}
	if !fs.s.mem.TryTake(n * sessionEntryBytes) {
		return false
	}
	fs.children += n * sessionEntryBytes
	return true
}

func (fs *fetchSessions) shrink(n int64) {
	fs.s.mem.Give(n * sessionEntryBytes)
	fs.children -= n * sessionEntryBytes
}

// drop forgets session id.
func (fs *fetchSessions) drop(id int32) {
	st := fs.byID[id]
	if st == nil {
		return
	}
	fs.shrink(int64(len(st.parts)))
	delete(fs.byID, id)
	for i, o := range fs.order {
		if o == id {
			fs.order = append(fs.order[:i], fs.order[i+1:]...)
			break
		}
	}
}

// close gives back everything (the connection closed).
func (fs *fetchSessions) close() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for id := range fs.byID {
		fs.drop(id)
	}
}
