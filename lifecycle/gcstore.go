package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/ferrykit/ferry/payloadstore"
)

// tmpIDPrefix starts the id of the short-lived payload objects through which
// gc writes and reads its own objects (see gcStore). One left behind by a
// crash is an ordinary orphan: no record references it, and gc collects it.
const tmpIDPrefix = "ferry-gc-tmp-"

// gcStore reads and writes gc's own small JSON objects (checkpoints,
// quarantine manifests) under "<topic>/.ferry-gc/", and names the keys of a
// topic's objects.
//
// The stores have no call that writes or reads an arbitrary key: Publish
// names its object "<topic>/<shard>/<id>" and Download only opens payload
// keys. So an object is written by publishing it under a temporary payload
// id and moving it to its key, and read by copying it to a temporary payload
// key, downloading that and removing it.
type gcStore struct {
	ps     payloadstore.PayloadStore
	ops    payloadstore.ObjectStore
	root   payloadstore.Root
	topic  string
	prefix string // "<topic>/.ferry-gc/"
}

func newGCStore(ps payloadstore.PayloadStore, topic string) (*gcStore, error) {
	ops, err := payloadstore.Objects(ps)
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	prefix, err := payloadstore.GCPrefix(topic)
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	return &gcStore{ps: ps, ops: ops, root: ops.Root(), topic: topic, prefix: prefix}, nil
}

// key returns the key of fullPath in this store (its root cut off), or ""
// when fullPath does not lie under the root.
func (g *gcStore) key(fullPath string) string {
	k, ok := strings.CutPrefix(fullPath, string(g.root)+"/")
	if !ok {
		return ""
	}
	return k
}

// put stores v as JSON at prefix+rel, replacing what is there.
func (g *gcStore) put(ctx context.Context, rel string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	p := payloadstore.BytesPayload(b)
	p.ID = tmpIDPrefix + uuid.NewString()
	resp, err := g.ps.Publish(ctx, g.topic, p)
	if err != nil {
		return fmt.Errorf("gc: writing %s: %w", g.prefix+rel, err)
	}
	tmp := g.key(resp.FullPayloadPath)
	if err := g.ops.Move(ctx, tmp, g.prefix+rel); err != nil {
		_ = g.ops.Remove(context.WithoutCancel(ctx), tmp)
		return fmt.Errorf("gc: writing %s: %w", g.prefix+rel, err)
	}
	return nil
}

// get reads the JSON object at prefix+rel into v; found is false when there
// is none. An object that is not v's JSON is found with an error wrapping
// errUnreadable.
func (g *gcStore) get(ctx context.Context, rel string, v any) (found bool, err error) {
	tmp, err := payloadstore.ObjectKey(g.topic, tmpIDPrefix+uuid.NewString())
	if err != nil {
		return false, err
	}
	if err := g.ops.Copy(ctx, g.prefix+rel, tmp); err != nil {
		if errors.Is(err, payloadstore.ErrPayloadNotFound) {
			return false, nil
		}
		return false, fmt.Errorf("gc: reading %s: %w", g.prefix+rel, err)
	}
	defer g.ops.Remove(context.WithoutCancel(ctx), tmp) //nolint:errcheck // a leftover is an orphan gc collects
	b, err := payloadstore.DownloadBytes(ctx, g.ps, g.root.Path(tmp))
	if err != nil {
		return false, fmt.Errorf("gc: reading %s: %w", g.prefix+rel, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return true, fmt.Errorf("gc: %s: %w: %v", g.prefix+rel, errUnreadable, err)
	}
	return true, nil
}

// errUnreadable: one of gc's objects is not the JSON it should be.
var errUnreadable = errors.New("not readable as gc's JSON")
