package integration

import (
	"context"
	"testing"
	"time"

	"github.com/ferrykit/ferry/proxy"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL passes through the proxy: SaslHandshake and SaslAuthenticate are
// forwarded on the client's own upstream connection, so each client
// authenticates as itself (PLAIN and SCRAM-SHA-256 against a broker with a
// SASL_PLAINTEXT listener, scripts/kafka-broker with FERRY_KAFKA_SASL=1);
// a wrong password is refused by the broker.
func TestProxySASL(t *testing.T) {
	env := ownBrokerEnv(t, "FERRY_KAFKA_SASL=1")
	saslAddr := env["FERRY_KAFKA_SASL_BROKERS"]
	if saslAddr == "" {
		t.Fatal("the broker has no SASL listener (FERRY_KAFKA_SASL_BROKERS unset)")
	}
	s := startProxyServer(t, proxy.Config{Upstream: []string{saslAddr}})
	mechs := map[string]sasl.Mechanism{
		"PLAIN":         plain.Auth{User: "alice", Pass: "alice-secret"}.AsMechanism(),
		"SCRAM-SHA-256": scram.Auth{User: "alice", Pass: "alice-secret"}.AsSha256Mechanism(),
	}
	for name, m := range mechs {
		t.Run(name, func(t *testing.T) {
			produceConsumeWith(t, s.Addr(), nil, 20, []kgo.Opt{kgo.SASL(m)})
		})
	}
	t.Run("wrong password", func(t *testing.T) {
		cl := proxyClient(t, s.Addr(), nil, kgo.SASL(plain.Auth{User: "alice", Pass: "nope"}.AsMechanism()),
			kgo.RequestRetries(0))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl); err == nil {
			t.Fatal("a wrong password was accepted through the proxy")
		}
	})
	t.Run("no SASL", func(t *testing.T) {
		cl := proxyClient(t, s.Addr(), nil, kgo.RequestRetries(0))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl); err == nil {
			t.Fatal("a client without SASL was served by a SASL listener through the proxy")
		}
	})
}
