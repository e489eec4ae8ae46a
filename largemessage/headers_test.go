package largemessage_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The size and digest headers are read as docs/FORMAT.md writes them:
// decimal digits only, 64 lowercase hex digits.
func TestStrictPayloadHeaders(t *testing.T) {
	store := payloadstore.NewMemStore(t.Name(), nil)
	ctx := context.Background()
	ser := largemessage.NewSerializer(store, largemessage.Codec{})
	orig := &kgo.Record{Topic: "t", Value: make([]byte, 4096)}
	if _, err := ser.Offload(ctx, orig, largemessage.Limits{Threshold: 1000}); err != nil {
		t.Fatal(err)
	}
	set := func(name, value string) *kgo.Record {
		r := &kgo.Record{Topic: "t", Value: orig.Value}
		for _, h := range orig.Headers {
			if h.Key == name {
				h.Value = []byte(value)
			}
			r.Headers = append(r.Headers, h)
		}
		return r
	}
	de := largemessage.NewDeserializer(store, false)
	var sha string
	for _, h := range orig.Headers {
		if h.Key == largemessage.HeaderPayloadSHA256 {
			sha = string(h.Value)
		}
	}
	for _, bad := range []*kgo.Record{
		set(largemessage.HeaderPayloadSize, "+4096"),
		set(largemessage.HeaderPayloadSize, " 4096"),
		set(largemessage.HeaderPayloadSHA256, strings.ToUpper(sha)),
	} {
		if err := de.Resolve(ctx, bad); !errors.Is(err, largemessage.ErrCorruptReference) {
			t.Errorf("%v: got %v, want ErrCorruptReference", bad.Headers, err)
		}
	}
	if err := de.Resolve(ctx, set("none", "")); err != nil {
		t.Fatalf("the record as written: %v", err)
	}
}
