package interceptor

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// A batch the chain forwards as the client sent it is not refused for the
// topic's compression.type: the broker measures it, as it would without
// the proxy (the proxy's bound, the codec's worst case over the records,
// refused snappy batches of JSON that the broker stores lz4 well within
// the limit: found by a helper). A batch the chain rewrote is still
// measured by that bound, before the broker sees it.
func TestProduceTopicCompressionUnchangedBatch(t *testing.T) {
	ctx := context.Background()
	vals := make([]string, 300)
	for i := range vals {
		vals[i] = fmt.Sprintf(`{"i":%d,"v":%q}`, i, strings.Repeat("a", 1000))
	}
	batch := plainBatch(t, 2, -1, vals...) // snappy: a few KB
	if len(batch) > 50_000 {
		t.Fatalf("the snappy batch is %d bytes: the test wants it well under the limit", len(batch))
	}
	limits := func(context.Context, []string) map[string]TopicLimit {
		return map[string]TopicLimit{"t": {MaxMessageBytes: 100_000, Compression: "lz4"}}
	}
	vj, err := New(ctx, "validate-json", map[string]string{"topic.pattern": ".*"})
	if err != nil {
		t.Fatal(err)
	}
	if vj.Close != nil {
		defer vj.Close()
	}
	req := buildRequest(t, map[string][]byte{"t": batch})
	out := NewChain([]Instance{vj}, Options{}).InterceptProduce(ctx, req, limits)
	if !out.Forward || len(out.Answered) != 0 {
		t.Fatalf("an unchanged %d-byte batch under lz4: answered %v, want it forwarded", len(batch), out.Answered)
	}
	if !bytes.Equal(req.Topics[0].Partitions[0].Records, batch) {
		t.Fatal("the unchanged batch was rewritten")
	}
	out.Release()

	enc, err := New(ctx, "encrypt", map[string]string{KeyEncryptKeyURL: encKeyURL(t), "topic.pattern": ".*"})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	req = buildRequest(t, map[string][]byte{"t": batch})
	out = NewChain([]Instance{enc}, Options{}).InterceptProduce(ctx, req, limits)
	defer out.Release()
	if len(out.Answered) != 1 || out.Answered[0].ErrorCode != kerr.MessageTooLarge.Code || !strings.Contains(out.Answered[0].ErrorMessage, "topic compression.type lz4") {
		t.Fatalf("a sealed batch (incompressible, over 300 KB) under lz4 and a 100 KB limit: answered %v, want MESSAGE_TOO_LARGE", out.Answered)
	}
}
