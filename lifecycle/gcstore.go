package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ferrykit/ferry/payloadstore"
)

// gcStore reads and writes gc's own small JSON objects (checkpoints,
// quarantine manifests) under "<topic>/.ferry-gc/" (ObjectStore.Put and
// Get), and names the keys of a topic's objects.
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

// maxGCObject bounds what gc reads of one of its own objects.
const maxGCObject = 64 << 20

// put stores v as JSON at prefix+rel, replacing what is there.
func (g *gcStore) put(ctx context.Context, rel string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := g.ops.Put(ctx, g.prefix+rel, b); err != nil {
		return fmt.Errorf("gc: writing %s: %w", g.prefix+rel, err)
	}
	return nil
}

// get reads the JSON object at prefix+rel into v; found is false when there
// is none. An object that is not v's JSON is found with an error wrapping
// errUnreadable.
func (g *gcStore) get(ctx context.Context, rel string, v any) (found bool, err error) {
	b, err := g.ops.Get(ctx, g.prefix+rel, maxGCObject)
	if errors.Is(err, payloadstore.ErrPayloadNotFound) {
		return false, nil
	}
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
