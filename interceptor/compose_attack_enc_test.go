package interceptor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Security review of issue #13: through [encrypt, large-message], a client
// produces a record that claims to be offloaded (the header
// large-message: true, and ferry's own payload headers) with a value that
// is not a reference. Whatever the produce answer, the topic must not end
// up holding a record that fails every consumer's fetch through the proxy
// (a poison pill for the partition).
func TestAttackEncClaimedReferenceThroughEncryptThenLargeMessage(t *testing.T) {
	enc := encrypter(t, map[string]string{KeyTopicPattern: "big", KeyEncryptKeyURL: encKeyURL(t)})
	lm, _ := lmSetup(t, nil)
	cl := newCluster(t, map[string]map[string]*string{"big": nil})
	cl.use(Options{}, enc, lm)
	c := cl.client(t)
	for i, hs := range [][]kgo.RecordHeader{
		{{Key: "large-message", Value: []byte("true")}},
		{{Key: "large-message", Value: []byte("true")}, {Key: "ferry.payload.size", Value: []byte("5")}},
		{{Key: "large-message-key", Value: []byte("true")}},
	} {
		err := firstErr(produceBatch(t, c, &kgo.Record{Topic: "big", Key: fmt.Appendf(nil, "k%d", i), Value: []byte("not a reference"), Headers: hs}))
		t.Logf("claim %d: produce -> %v", i, err)
		// A value claimed offloaded, then sealed, is refused
		// (sealedReference): large-message can neither check nor resolve
		// it, and a real one's payload would be lost.
		if i < 2 {
			a := cl.outcomes[len(cl.outcomes)-1].Answered
			if !errors.Is(err, kerr.InvalidRecord) || len(a) != 1 || !strings.Contains(a[0].ErrorMessage, "sealed by encrypt") {
				t.Fatalf("claim %d: produce -> %v, answered %+v; want INVALID_RECORD naming the sealed reference", i, err, a)
			}
		}
	}
	resp, _ := fetchRaw(t, c, "big")
	n := len(records(t, "big", &resp.Topics[0].Partitions[0]))
	fc := NewChain([]Instance{enc, lm}, Options{TopicName: cl.names})
	out := fc.InterceptFetch(context.Background(), resp)
	if len(out.Failed) != 0 {
		t.Fatalf("the broker holds %d records produced through the proxy, and the proxy's fetch fails: %+v", n, out.Failed)
	}
}
