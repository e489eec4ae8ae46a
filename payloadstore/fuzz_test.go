package payloadstore

import (
	"strings"
	"testing"
)

// FuzzKey feeds arbitrary references' paths to the checks that stand
// between a reference and the store: no input may panic, and an accepted
// path names a key of the documented layout under the root, which
// ObjectKey rebuilds to the same string.
func FuzzKey(f *testing.F) {
	root := Root("file:///var/ferry")
	for _, s := range []string{"orders/5e/x", "orders/../x/y", "a/b/c", strings.Repeat("a/", 600), "t/2d/" + strings.Repeat("y", 300),
		"file:///var/ferry/orders/x", "%2e%2e/x/y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		full := root.Path(s)
		key, kp, err := root.KeyOf(full)
		_, perr := PathKey(full) // root-less: may read a two-segment key otherwise, never panics
		if err != nil {
			return
		}
		if perr != nil {
			t.Fatalf("Key accepted %q, PathKey refused it: %v", full, perr)
		}
		if key != s || len(key) > MaxKeyBytes {
			t.Fatalf("Key(%q) = %q", full, key)
		}
		if kp.Shard == "" { // the layout before shards: "<topic>/<id>"
			if key != kp.Topic+"/"+kp.ID {
				t.Fatalf("Key(%q) = %q, parts %+v", full, key, kp)
			}
			return
		}
		again, err := ObjectKey(kp.Topic, kp.ID)
		if err != nil || again != key {
			t.Fatalf("ObjectKey(%q, %q) = %q, %v; want %q", kp.Topic, kp.ID, again, err, key)
		}
		if strings.Contains(key, "..") && strings.Contains(key, "/../") {
			t.Fatalf("a relative segment got through: %q", key)
		}
	})
}
