package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrykit/ferry/payloadstore"
)

// Keys under the topic's gc prefix: a run's quarantine folder is
// "q/<run>/", holding its manifest and its objects as
// "q/<run>/<shard>/<id>"; S3 touches copy through "touch/<uuid>".
const (
	quarantineDir = "q/" // payloadstore.Confirm looks for objects there
	manifestName  = "manifest.json"
	touchDir      = "touch/"
	// touchLeftoverAge: a temporary copy of an S3 touch older than this
	// is left from a touch that did not finish, and is removed.
	touchLeftoverAge = time.Hour
)

// manifest is the JSON object a run stores in its quarantine folder before
// it moves anything there, so that a later run can finish a run that did not
// (crashed, killed, cancelled) with the same rule.
type manifest struct {
	Version int       `json:"version"`
	Run     string    `json:"run"`
	Topic   string    `json:"topic"`
	TopicID string    `json:"topic_id,omitempty"`
	Mode    Mode      `json:"mode"`
	Start   time.Time `json:"start"`
	// E1: per partition, the offset from which every record not taken
	// into account by the run's decision lies (the end of its full read,
	// or the high watermarks taken before it listed the store). Records
	// from E1 on are read before anything is removed from quarantine.
	E1 offsets `json:"e1"`
	// Mirrors: the same for each mirror topic the run read
	// (Options.Mirrors). A mirror a later run names that is not here is
	// read from its start.
	Mirrors map[string]offsets `json:"mirrors,omitempty"`
}

// qobj is one object in quarantine.
type qobj struct {
	run  string                  // the run whose folder holds it
	qkey string                  // its key in quarantine
	key  string                  // its original key
	name string                  // objectName of its original full path
	info payloadstore.ObjectInfo // FullPath: its original full path
	e1   offsets                 // its run's E1; nil: restore unconditionally
	me1  map[string]offsets      // its run's E1 of each mirror (with e1 set)
}

// newRunID names a run: its start time (UTC, sortable) and 32 random bits.
func newRunID(start time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return start.UTC().Format("20060102T150405.000000000Z") + "-" + hex.EncodeToString(b[:])
}

func (g *gcStore) runDir(run string) string { return g.prefix + quarantineDir + run + "/" }

// quarantineKey is where the object at key goes in run's folder: the key
// with the topic segment replaced by the folder.
func (g *gcStore) quarantineKey(run, key string) string {
	return g.runDir(run) + strings.TrimPrefix(key, g.topic+"/")
}

// leftoverRun is the quarantine folder of an earlier run.
type leftoverRun struct {
	run      string
	manifest *manifest // nil: none, or unreadable
	objs     []qobj
}

// listLeftovers lists the quarantine folders of earlier runs, with their
// manifests.
//
// Without readManifests (a dry run) the manifests are not read.
func (g *gcStore) listLeftovers(ctx context.Context, readManifests bool) ([]*leftoverRun, error) {
	byRun := map[string]*leftoverRun{}
	var order []string
	err := g.ops.ListKeys(ctx, g.prefix+quarantineDir, func(key string, oi payloadstore.ObjectInfo) error {
		rel := strings.TrimPrefix(key, g.prefix+quarantineDir)
		run, rest, ok := strings.Cut(rel, "/")
		if !ok || run == "" || rest == "" {
			return nil
		}
		lr := byRun[run]
		if lr == nil {
			lr = &leftoverRun{run: run}
			byRun[run] = lr
			order = append(order, run)
		}
		if rest == manifestName {
			return nil
		}
		orig := g.topic + "/" + rest
		oi.FullPath = g.root.Path(orig)
		lr.objs = append(lr.objs, qobj{run: run, qkey: key, key: orig, name: objectName(oi.FullPath), info: oi})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gc: listing the quarantine of topic %s: %w", g.topic, err)
	}
	var out []*leftoverRun
	for _, run := range order {
		lr := byRun[run]
		out = append(out, lr)
		if !readManifests {
			continue
		}
		var m manifest
		found, err := g.get(ctx, quarantineDir+run+"/"+manifestName, &m)
		if err != nil && !errors.Is(err, errUnreadable) {
			return nil, err
		}
		if found && err == nil && m.Run == run && m.Topic == g.topic {
			lr.manifest = &m
		}
	}
	return out, nil
}

// removeTouchLeftovers removes temporary copies of S3 touches that did not
// finish (older than touchLeftoverAge by the store's clock compared with
// now).
func (g *gcStore) removeTouchLeftovers(ctx context.Context, now time.Time) {
	var keys []string
	_ = g.ops.ListKeys(ctx, g.prefix+touchDir, func(key string, oi payloadstore.ObjectInfo) error {
		if oi.ModTime.Before(now.Add(-touchLeftoverAge)) {
			keys = append(keys, key)
		}
		return nil
	})
	for _, k := range keys {
		_ = g.ops.Remove(ctx, k)
	}
}

// moveOutcome is what quarantining one candidate did.
type moveOutcome int

const (
	moved   moveOutcome = iota // in quarantine
	changed                    // rewritten, touched or removed since it was listed: left (or put back) in place
	failed                     // an error; the object is still at its key
)

// quarantineOne moves the listed object oi to run's folder. It checks that
// the object has not changed since it was listed (Version) before moving it;
// where the store's move keeps the object's Version (the file store's
// rename(2), the mem store), it checks again after the move, which closes the
// window between the check and the move, and puts back at once an object
// that changed.
func (g *gcStore) quarantineOne(ctx context.Context, run string, oi payloadstore.ObjectInfo, keepsVersion bool) (qobj, moveOutcome, error) {
	key := g.key(oi.FullPath)
	if key == "" {
		return qobj{}, failed, fmt.Errorf("gc: %s does not lie under the store root %s", oi.FullPath, g.root)
	}
	o := qobj{run: run, qkey: g.quarantineKey(run, key), key: key, name: objectName(oi.FullPath), info: oi}
	pre, err := g.ops.Stat(ctx, key)
	if errors.Is(err, payloadstore.ErrPayloadNotFound) {
		return o, changed, nil
	}
	if err != nil {
		return o, failed, err
	}
	if !same(oi, pre, keepsVersion) {
		return o, changed, nil
	}
	if err := g.ops.Move(ctx, key, o.qkey); err != nil {
		// The move may have happened in part (cloud stores copy, then
		// delete): find out where the object is.
		if _, qerr := g.ops.Stat(ctx, o.qkey); qerr == nil {
			if _, kerr := g.ops.Stat(ctx, key); kerr == nil {
				_ = g.ops.Remove(ctx, o.qkey) // copied but not removed: the original stays
				return o, failed, err
			}
			return o, moved, nil // moved, whatever the error said
		}
		if _, kerr := g.ops.Stat(ctx, key); errors.Is(kerr, payloadstore.ErrPayloadNotFound) {
			return o, changed, nil // removed by someone else meanwhile
		}
		return o, failed, err
	}
	if keepsVersion {
		post, err := g.ops.Stat(ctx, o.qkey)
		if err == nil && !same(oi, post, true) {
			// Republished or touched between the check and the move:
			// put it back now.
			if rerr := g.restoreOne(ctx, o, true); rerr != nil {
				return o, moved, nil // still in quarantine: the recheck decides
			}
			return o, changed, nil
		}
	}
	return o, moved, nil
}

// same reports whether the object described by now is the one listed as
// listed. Where Stat and List describe objects alike (file and mem stores:
// comparable Versions, the file's inode among them) the Versions are
// compared; the cloud stores' listing and Stat spell Version differently
// (MD5 vs ETag), so there the ModTime and size are (S3 keeps ModTime to the
// second, so a rewrite within the same second goes unnoticed here: the
// recheck still covers it).
func same(listed, now payloadstore.ObjectInfo, versions bool) bool {
	if versions && listed.Version != "" {
		return listed.Version == now.Version
	}
	return listed.ModTime.Equal(now.ModTime) && listed.Size == now.Size
}

// restoreOne moves o back to its key. When an object is there already (a
// republish of a content id, which has the same bytes), the quarantined copy
// is removed instead. Where the move keeps the object's ModTime (rename),
// the restored object is touched, so that its ModTime is never older than
// the records that made gc restore it.
func (g *gcStore) restoreOne(ctx context.Context, o qobj, keepsVersion bool) error {
	if _, err := g.ops.Stat(ctx, o.key); err == nil {
		return g.ops.Remove(ctx, o.qkey)
	} else if !errors.Is(err, payloadstore.ErrPayloadNotFound) {
		return err
	}
	if err := g.ops.Move(ctx, o.qkey, o.key); err != nil {
		if _, serr := g.ops.Stat(ctx, o.key); serr == nil {
			return nil // restored (by a concurrent run, or the error came late)
		}
		return err
	}
	if keepsVersion {
		return g.ops.Touch(ctx, o.key)
	}
	return nil
}

// removeManifest removes run's manifest (the folder is then empty).
func (g *gcStore) removeManifest(ctx context.Context, run string) error {
	return g.ops.Remove(ctx, g.runDir(run)+manifestName)
}

// parallel calls fn(i) for i in [0, n) on at most workers goroutines, and
// tick from the calling goroutine every 200ms and at the end. It stops
// starting new calls once ctx is done.
func parallel(ctx context.Context, n, workers int, fn func(i int), tick func()) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			tick()
			return
		case <-t.C:
			tick()
		}
	}
}
