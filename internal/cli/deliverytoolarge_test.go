package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferrykit/ferry/payloadstore"
)

// hungPublish is a store whose Publish waits until its context ends.
type hungPublish struct {
	payloadstore.PayloadStore
	called chan struct{}
}

func (s hungPublish) Publish(ctx context.Context, topic string, p payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	select {
	case s.called <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return payloadstore.PayloadResponse{}, ctx.Err()
}

// The broker refuses an inline record MESSAGE_TOO_LARGE and the Producer's
// re-offload (its store Publish) outlasts delivery.timeout.ms: the record
// is given up on, and the error says the broker answered without accepting
// it, not "the record was not sent: the client was still waiting on the
// broker" (what a fault-hunting helper saw: the request had gone out and
// been refused).
func TestDeliveryTimeoutDuringTooLargeRetry(t *testing.T) {
	c, brokers := cluster(t)
	refuseProduce(c, 0, kerr.MessageTooLarge.Code)
	ctx := context.Background()
	inner, cfg := fileStore(t)
	store := hungPublish{inner, make(chan struct{}, 1)}
	delivery := time.Second
	s := testSender(t, brokers, store, cfg, delivery)
	start := time.Now()
	_, err := s.sendBytes(ctx, "t", "small", nil, []byte(strings.Repeat("v", 1000)), nil)
	took := time.Since(start)
	select {
	case <-store.called:
	default:
		t.Fatalf("the Producer never re-offloaded the refused record; sendBytes: %v", err)
	}
	if err == nil {
		t.Fatal("sendBytes succeeded with every Produce refused")
	}
	msg := err.Error()
	t.Logf("after %v: %v", took.Round(time.Millisecond), msg)
	if strings.Contains(msg, "the record was not sent") || !strings.Contains(msg, "answered its produce request without accepting it") {
		t.Fatalf("error %q: want it to say the broker answered without accepting the record", msg)
	}
	if took > delivery+deliveryGrace+safeAbortWait+abortWait {
		t.Fatalf("gave up after %v", took)
	}
}
