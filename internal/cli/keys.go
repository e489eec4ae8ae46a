package cli

import (
	"slices"
	"strings"

	"github.com/ferrykit/ferry/interceptor"
	_ "github.com/ferrykit/ferry/interceptor/wasm" // registers the wasm interceptor and its keys
	"github.com/ferrykit/ferry/internal/kafkaconf"
	"github.com/ferrykit/ferry/internal/schemareg"
	"github.com/ferrykit/ferry/internal/suggest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/serde"
)

// The properties (--config, -X) each kind of command reads: the one place
// to add a key. A key that is not listed is passed over with a warning
// (a Kafka client setting ferry has no use for, say), unless it is one or
// two edits from a listed key: then it is taken for a misspelling and is a
// usage error naming the key it is near (misspelledKey), so that
// "large.mesage.threshold.bytes" cannot silently leave the default in force.

// clientKeys are the properties ferry produce, consume and gc read
// (consumerKeys: the consumer group's, read by consume alone).
func clientKeys() []string {
	return append([]string{
		keyBootstrap, keyClientID, keyMaxRequestSize, keyFetchMaxBytes, keyMaxPartitionFetchBytes, keyReceiveMaxBytes, keyDeliveryTimeout,
		largemessage.KeyCompressionType, largemessage.KeyMaxBlock, largemessage.KeyMaxPollInterval,
		"compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
		"key.serializers", "value.serializers", "key.deserializers", "value.deserializers",
	}, slices.Concat(consumerKeys(), largemessage.Keys(), kafkaconf.Keys(), schemareg.ConnectionKeys, serde.SchemaKeys)...)
}

// interceptorKeys are the properties the proxy's built-in interceptors read
// (ferry proxy --interceptors NAME with -X).
func interceptorKeys() []string {
	keys, _ := interceptor.KnownKeys() // the built-ins' and wasm's (interceptor.RegisterKeys)
	return keys
}

// kafkaKeysNearOurs are Kafka client properties that are a typo's distance
// from a key above; they are Kafka's own names, not misspellings, and stay
// warnings. (TestKafkaKeysAreNotTypos checks every Java client key.)
var kafkaKeysNearOurs = []string{"key.serializer", "value.serializer", "key.deserializer", "value.deserializer", "fetch.min.bytes"}

// isChain reports whether v lists serde stages only ("avro,large-message"):
// the value of key.serializers given to Kafka's key.serializer by mistake.
func isChain(v string) bool {
	names := serde.Names()
	for _, n := range strings.Split(v, ",") {
		if !slices.Contains(names, strings.TrimSpace(n)) {
			return false
		}
	}
	return true
}

// misspelledKey is a usage error when key, which is not in known, is
// likely a misspelling of keys in known (suggest.Nearest); nil otherwise.
func misspelledKey(key string, known []string) error {
	if slices.Contains(kafkaKeysNearOurs, key) {
		return nil
	}
	if near := suggest.Nearest(key, known, false); len(near) > 0 {
		return usageErrorf("unknown property %s (did you mean %s?)", key, suggest.OrList(near))
	}
	return nil
}
