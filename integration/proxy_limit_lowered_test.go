package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
)

// A topic's max.message.bytes lowered on the broker while the proxy holds
// the old value in its cache (topic.config.refresh.ms, 5 min by default):
// the next record between the two limits is offloaded, not refused
// MESSAGE_TOO_LARGE, which franz-go and librdkafka give up on (Ferry never
// causes a MESSAGE_TOO_LARGE, KIP-126). The broker's refusal of the batch
// the proxy passed by the stale limit reaches the producer as
// KAFKA_STORAGE_ERROR; the producer (franz-go, kcat, Java's) sends it again, and the proxy, having
// read the limit again, offloads it. Before, the record failed once and
// only the next one was offloaded.
func TestProxyLoweredLimitRetried(t *testing.T) {
	kcat := kcatPath(t)
	kafkaToolsCP(t)
	storeURL := interceptorStoreURL(t)
	for _, producer := range []string{"franz-go", "kcat", "java"} {
		t.Run(producer, func(t *testing.T) {
			high, low := "3000000", "1048588"
			topic := clientTopic(t, 1, map[string]*string{"max.message.bytes": &high})
			via := interceptorProxy(t, 0, largeMessageSpec(topic, storeURL))
			want := map[string][]byte{"before": printable(81, 2<<20), "after": printable(82, 2<<20)}
			produce := func(key string) {
				t.Helper()
				switch producer {
				case "franz-go":
					cl := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(8<<20))
					if err := cl.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Key: []byte(key), Value: want[key]}).FirstErr(); err != nil {
						t.Fatalf("franz-go produce of %q (%d bytes) through the proxy: %v", key, len(want[key]), err)
					}
				case "kcat":
					file := filepath.Join(t.TempDir(), key)
					if err := os.WriteFile(file, want[key], 0o600); err != nil {
						t.Fatal(err)
					}
					runClient(t, nil, kcat, "-P", "-b", via, "-t", topic, "-k", key, "-X", "message.max.bytes=8000000", file)
				case "java":
					// Idempotent, acks=all; --sync: a failed send exits 1.
					line := append([]byte(key+"\t"), want[key]...)
					javaBigHeap(t, append(line, '\n'), javaConsoleProducer, "--bootstrap-server", via, "--topic", topic, "--sync",
						"--reader-property", "parse.key=true", "--command-property", "max.request.size=8000000",
						"--command-property", "request.timeout.ms=60000", "--command-property", "delivery.timeout.ms=120000")
				}
			}
			// Inline under the topic's 3,000,000 bytes: the proxy now holds
			// that limit.
			produce("before")
			// The proxy retries a refusal when the limit it checked the
			// batch against had been cached for a second (limitRecheck);
			// the limit read for "before" must be that old by "after".
			cachedAt := time.Now()
			adm := kadm.NewClient(client(t))
			if _, err := adm.AlterTopicConfigs(ctxT(t, 30*time.Second), []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &low}}, topic); err != nil {
				t.Fatal(err)
			}
			// The precondition: the broker refuses a 2 MiB batch now.
			// Probes it accepted meanwhile (the change not applied yet)
			// stay in the topic, inline.
			direct := client(t, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(8<<20))
			probes := 0
			waitFor(t, time.Minute, func() bool {
				key := fmt.Sprintf("probe-%d", probes)
				err := direct.ProduceSync(ctxT(t, 30*time.Second), &kgo.Record{Key: []byte(key), Value: want["before"]}).FirstErr()
				if err == nil {
					want[key] = want["before"]
					probes++
					time.Sleep(100 * time.Millisecond)
					return false
				}
				if !errors.Is(err, kerr.MessageTooLarge) {
					t.Fatalf("probe straight to the broker: %v, want MESSAGE_TOO_LARGE", err)
				}
				return true
			}, func() string { return "the broker never applied max.message.bytes=" + low })
			time.Sleep(time.Until(cachedAt.Add(1100 * time.Millisecond)))
			produce("after")

			raw := consumeRaw(t, topic, len(want))
			for _, r := range raw {
				k := string(r.Key)
				if offloaded := largemessage.IsOffloaded(r); offloaded != (k == "after") {
					t.Fatalf("broker holds %q as %d bytes, offloaded=%v", k, len(r.Value), offloaded)
				}
				if k != "after" && !bytes.Equal(r.Value, want[k]) {
					t.Fatalf("broker holds %q as %d bytes, want its %d bytes inline", k, len(r.Value), len(want[k]))
				}
			}
			sameDigests(t, "franz-go consume through the proxy", fromKgo(proxyRecords(t, via, topic, len(want), kgo.FetchMaxBytes(64<<20))), want)
		})
	}
}
