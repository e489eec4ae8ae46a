package cli

import (
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"
)

// A record that cannot fit its topic even with key and value offloaded (a
// tiny large.message.threshold.bytes and a long key) is refused with one
// line naming the topic and the limit, nothing is produced, and the store
// keeps no object of it: the refusal comes before anything is published
// (in memory, the Serializer's plan; streamed, the reference the value
// will get, computed once the file is hashed), so nothing needs deleting.
func TestRecordTooLargeEvenOffloaded(t *testing.T) {
	longKey := base64.RawURLEncoding.EncodeToString(mustRead(t, mustRandom(t, 1500)))
	for _, tc := range []struct {
		name, want string
		size       int
	}{
		{"in memory", "the record cannot fit topic t even with its key and value offloaded: the limit is 100 bytes, set by large.message.threshold.bytes", 50},
		{"streamed", "the record cannot fit topic t even with its value offloaded: the limit is 100 bytes, set by large.message.threshold.bytes (with the reference", 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, brokers := cluster(t)
			dir := t.TempDir()
			storeDir := filepath.Join(dir, "store")
			f, _ := randomFile(t, dir, "f", tc.size, 24)
			r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "--store", storeDir,
				"-X", "large.message.threshold.bytes=100", "--key", longKey, f)
			if r.code != 1 || r.stdout != "" {
				t.Errorf("exit %d, stdout %q; want 1 and nothing produced", r.code, r.stdout)
			}
			oneErrorLine(t, r, "ferry: "+f+": "+tc.want)
			if strings.Contains(r.stderr, "deleted") {
				t.Errorf("a payload was published, then deleted: %s", r.stderr)
			}
			t.Run("store untouched", func(t *testing.T) {
				if objs := storeObjects(t, storeDir); len(objs) != 0 {
					t.Errorf("store objects left: %v", objs)
				}
			})
		})
	}
}
