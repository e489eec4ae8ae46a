package integration

// Security review of issue #13: how many KMS calls an untrusted client can
// make the proxy's encrypt interceptor issue (the KMS is a shared, metered,
// rate-limited service: AWS KMS throttles per account and region, so a
// flood from the proxy starves every other user of the key).

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/storetest"
)

// One Produce request naming 200 made-up topics that match the encrypt
// pattern (none exists; the client need not be allowed to write any):
// each gets a data key of its own, wrapped by the KMS, before the broker
// refuses the partition. A client thus turns one request into one KMS
// Encrypt per topic it invents, and by cycling more names than
// encrypt.data.key.cache.max.entries into one per record, without limit.
func TestAttackEncKMSEncryptPerMadeUpTopic(t *testing.T) {
	key, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	via := interceptorProxy(t, 0, encryptSpec("atk-enc-amp-.*", key))
	cl := viaClient(t, via)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	sets := map[string][]byte{}
	for i := range 200 {
		sets[fmt.Sprintf("atk-enc-amp-%s-%d", suffix, i)] = rawBatch(mustRecords(t, []byte("x")), 0, 1)
	}
	before := len(fp.Requests())
	codes := rawProduce(t, cl, sets, nil)
	calls := len(fp.Requests()) - before
	var sample int16
	for _, c := range codes {
		sample = c
	}
	t.Logf("200 made-up topics in one Produce: %d KMS requests, partition code e.g. %d", calls, sample)
	if calls > 10 {
		t.Fatalf("one Produce naming 200 topics that do not exist made the proxy call the KMS %d times", calls)
	}
}

// forgedSealed is a sealed record value (docs/FORMAT.md §9.3) naming the
// configured KEK by its key id but with a random wrapped data key: anyone
// who has read one sealed record knows the key id.
func forgedSealed(t *testing.T, keyURL string, wrapped int) []byte {
	t.Helper()
	id, err := envelope.KeyIDOf(keyURL)
	if err != nil {
		t.Fatal(err)
	}
	b := append([]byte(envelope.Magic), 1, envelope.AlgAES256GCM, 0, 0, 0, 0)
	b = append(b, id[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(wrapped))
	w := make([]byte, wrapped+12+16+8)
	rand.Read(w)
	return append(b, w...)
}

// A writer with direct access to the broker (the encrypt docs' own "Not
// covered" case) appends to each of 4 partitions one record carrying the
// marker and a sealed value with a made-up wrapped key (4 distinct wrapped
// keys). Every consumer that reads such a partition through the proxy fails
// it with KAFKA_STORAGE_ERROR (retriable) and fetches it again: each attempt
// asks the KMS to unwrap the same garbage again, as a failed unwrap is not
// remembered. Four records keep the KMS busy for as long as consumers
// retry: the calls grow with time x consumers x partitions, not with the
// wrapped keys forged.
func TestAttackEncKMSDecryptPerFetchRetryOfForgedRecord(t *testing.T) {
	key, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	const parts = 4
	topic := clientTopic(t, parts, nil)
	direct := client(t, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := range int32(parts) {
		rec := &kgo.Record{Partition: p, Key: []byte("forged"), Value: forgedSealed(t, key, 140),
			Headers: []kgo.RecordHeader{{Key: interceptor.HeaderEncrypted, Value: []byte("value")}}}
		if err := direct.ProduceSync(ctxT(t, 30*time.Second), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	via := interceptorProxy(t, 0, encryptSpec(topic, key))
	before, failedBefore := len(fp.Requests()), fp.UpstreamFailures()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan int, 2)
	for range 2 {
		cons := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		go func() {
			errs := 0
			for ctx.Err() == nil {
				fs := cons.PollFetches(ctx)
				if fs.NumRecords() > 0 {
					t.Errorf("a forged record was delivered: %q", fs.Records()[0].Value)
				}
				fs.EachError(func(string, int32, error) { errs++ })
			}
			done <- errs
		}()
	}
	errs := <-done + <-done
	// The KMS's answers: a request the KMS server did not answer (a loaded
	// machine: the fault proxy's own 502, then the SDK's retries) is a
	// transient failure, rightly not remembered, and not counted.
	unanswered := fp.UpstreamFailures() - failedBefore
	calls := len(fp.Requests()) - before - unanswered
	t.Logf("%d forged wrapped keys, 2 consumers for 5 s: %d KMS requests answered, %d unanswered (%d fetch errors surfaced)", parts, calls, unanswered, errs)
	if calls > parts+1 {
		t.Fatalf("%d forged wrapped keys made the proxy call the KMS %d times in 5 s (a failed unwrap is not cached)", parts, calls)
	}
}
