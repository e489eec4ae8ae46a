package integration

// Payload encryption (large.message.payload.encryption.*, package envelope,
// payloadstore.Encrypted) with the real KMS-compatible server (local-kms,
// gocloud awskms:// URLs from storetest.KMSKeyURL), the real broker, the file
// store and the real S3 server: 1 GiB through the ferry CLI in bounded
// memory; objects altered at rest refused by a real consumer with typed
// errors naming the record; key rotation; a KMS outage (a fault proxy in
// front of the KMS, storetest.KMSKeyURLViaFaultProxy) that appends nothing;
// and third-party clients through the proxy's large-message interceptor with
// encryption on.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/cli"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/proxy"
)

// epConfig is the library configuration of an encrypting store at storeURL
// whose new payloads are sealed under keyURL (empty: decryption only) and
// which also opens payloads sealed under decrypt.
func epConfig(storeURL, keyURL string, decrypt ...string) largemessage.Config {
	cfg := largemessage.DefaultConfig()
	cfg.StoreURL = storeURL
	cfg.Encryption.KeyURL = keyURL
	cfg.Encryption.DecryptKeyURLs = decrypt
	return cfg
}

// epConsume reads n records of topic from the start with a
// largemessage.Consumer over cfg's store (opened for reading, closed at the
// end of the test) and returns them resolved, each with its Err.
func epConsume(t *testing.T, cfg largemessage.Config, topic string, n int) []largemessage.Record {
	t.Helper()
	store, err := cfg.OpenStoreForReading(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cons := largemessage.NewConsumer(client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20)), cfg.NewDeserializer(store))
	ctx := ctxT(t, 2*time.Minute)
	var out []largemessage.Record
	for len(out) < n {
		recs, err := cons.PollRecords(ctx, n-len(out))
		if err != nil {
			t.Fatalf("consume %s: %v (after %d of %d records)", topic, err, len(out), n)
		}
		out = append(out, recs...)
	}
	return out
}

// epSealedAtRest reads the object at fullPath as it is stored (raw: a store
// without encryption) and checks that it is sealed: it starts with
// envelope.Magic, its size is a sealed object's of plainSize plaintext bytes,
// and no sample of the plaintext occurs in it. It streams, so a 1 GiB object
// is checked in bounded memory.
func epSealedAtRest(t *testing.T, raw payloadstore.PayloadStore, fullPath string, plainSize int64, samples ...[]byte) {
	t.Helper()
	rc, err := raw.Download(ctxT(t, 5*time.Minute), fullPath)
	if err != nil {
		t.Fatalf("download %s as stored: %v", fullPath, err)
	}
	defer rc.Close()
	head := make([]byte, envelope.FixedHeaderBytes)
	if _, err := io.ReadFull(rc, head); err != nil {
		t.Fatalf("%s: %v", fullPath, err)
	}
	if !bytes.HasPrefix(head, []byte(envelope.Magic)) {
		t.Fatalf("the object %s at rest starts with %q, not %q", fullPath, head[:len(envelope.Magic)], envelope.Magic)
	}
	keep := 0
	for _, s := range samples {
		keep = max(keep, len(s)-1)
	}
	buf := make([]byte, 0, keep+1<<20)
	buf = append(buf, head...)
	n := int64(len(head))
	for {
		k := len(buf)
		m, err := rc.Read(buf[k:cap(buf)])
		buf = buf[:k+m]
		n += int64(m)
		for _, s := range samples {
			// The new bytes with the end of the earlier ones.
			if bytes.Contains(buf[max(0, k-keep):], s) {
				t.Fatalf("the object %s at rest holds %d bytes of its plaintext as they are", fullPath, len(s))
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read %s: %v", fullPath, err)
		}
		if len(buf) > keep && cap(buf)-len(buf) < 64<<10 {
			buf = append(buf[:0], buf[len(buf)-keep:]...)
		}
	}
	if p, err := envelope.PlainSizeOf(head, n); err != nil || p != plainSize {
		t.Fatalf("the object %s is %d bytes: a sealed object of %d plaintext bytes (%v), want %d", fullPath, n, p, err, plainSize)
	}
}

// epSourceFile writes size pseudo-random bytes to dir/payload.bin and
// returns its path, its SHA-256 and two 64-byte samples of it (from its
// middle and near its end) for epSealedAtRest.
func epSourceFile(t *testing.T, dir string, size int64) (path string, sum []byte, samples [][]byte) {
	t.Helper()
	path = filepath.Join(dir, "payload.bin")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{'e', 'n', 'c', 1})
	buf := make([]byte, 1<<20)
	at := []int64{size / 2, size - 4096}
	for off := int64(0); off < size; {
		b := buf[:min(int64(len(buf)), size-off)]
		r.Read(b)
		for _, a := range at {
			if a >= off && a+64 <= off+int64(len(b)) {
				samples = append(samples, bytes.Clone(b[a-off:a-off+64]))
			}
		}
		h.Write(b)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		off += int64(len(b))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, h.Sum(nil), samples
}

// epBuildFerry starts buildFerry's build and returns a function that waits
// for it and returns the binary.
func epBuildFerry(t *testing.T) func() string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ferry")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/ferrykit/ferry/cmd/ferry")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return func() string {
		t.Helper()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out.String())
		}
		return bin
	}
}

// `ferry produce` then `ferry consume` move 1 GiB through the real broker,
// sealed under the real KMS's awskms:// key (a client properties file with
// large.message.payload.encryption.key.url), once through the file store and
// once through the S3 server: the same bytes come back, the object at rest
// is sealed, and each process's peak RSS stays far below the payload's size.
// FERRY_ENC_CLI_BYTES overrides the size.
func TestEncryptedPayloadCLIOneGiB(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	b := brokers(t)
	key := storetest.KMSKeyURL(t, "")
	size := int64(1 << 30)
	if v := os.Getenv("FERRY_ENC_CLI_BYTES"); v != "" {
		fmt.Sscan(v, &size)
	}
	dir := t.TempDir()
	start := time.Now()
	built := epBuildFerry(t) // while the source is written
	src, want, samples := epSourceFile(t, dir, size)
	props := filepath.Join(dir, "client.properties")
	// The store timeouts of slowStoreArgs: a busy machine's S3 server may
	// need longer than the default 60 s for 1 GiB.
	conf := largemessage.KeyEncryptionKeyURL + "=" + key + "\n" + largemessage.KeyStoreTimeout + "=900000\n" +
		largemessage.KeyMaxBlock + "=900000\n" + largemessage.KeyMaxPollInterval + "=900000\n"
	if err := os.WriteFile(props, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := built()
	t.Logf("wrote the %d MiB source and built ferry in %v", size>>20, time.Since(start).Round(time.Millisecond))
	for _, st := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"file store", func(t *testing.T) string { return "file://" + t.TempDir() }},
		{"S3", func(t *testing.T) string { return storetest.S3URL(t, "ferry-integration") }},
	} {
		t.Run(strings.ReplaceAll(st.name, " ", "_"), func(t *testing.T) {
			storeURL := st.url(t)
			topic := newTopic(t, nil)
			start := time.Now()
			rssProduce, out := runFerry(t, bin, "--config", props, "produce", "--brokers", b, "--topic", topic, "--store", storeURL, src)
			tookProduce := time.Since(start)
			if !strings.Contains(out, "offloaded") {
				t.Fatalf("produce output: %q", out)
			}
			recs := consumeRaw(t, topic, 1)
			if len(recs[0].Value) > 1024 || !largemessage.IsOffloaded(recs[0]) {
				t.Fatalf("kafka holds a %d-byte value, want only the reference", len(recs[0].Value))
			}
			raw := openStore(t, storeURL)
			objs := objectsUnder(t, raw, topic)
			if len(objs) != 1 {
				t.Fatalf("objects under %s: %v, want one", topic, objs)
			}
			start = time.Now()
			epSealedAtRest(t, raw, objs[0], size, samples...)
			t.Logf("checked the sealed object at rest in %v", time.Since(start).Round(time.Millisecond))

			outDir := filepath.Join(t.TempDir(), "out")
			start = time.Now()
			rssConsume, _ := runFerry(t, bin, "--config", props, "consume", "--brokers", b, "--topic", topic, "--store", storeURL,
				"--out", outDir, "-n", "1")
			tookConsume := time.Since(start)
			got := filepath.Join(outDir, filepath.Base(src))
			g, err := os.Open(got)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			n, err := io.Copy(h, g)
			g.Close()
			os.Remove(got)
			if err != nil || n != size || !bytes.Equal(h.Sum(nil), want) {
				t.Fatalf("consumed %d bytes (want %d), digest match %v, %v", n, size, bytes.Equal(h.Sum(nil), want), err)
			}
			mbps := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
			t.Logf("encrypted %d MiB %s: produce peak RSS %.1f MiB, %.0f MB/s (%v); consume peak RSS %.1f MiB, %.0f MB/s (%v)",
				size>>20, st.name, float64(rssProduce)/(1<<20), mbps(tookProduce), tookProduce.Round(time.Millisecond),
				float64(rssConsume)/(1<<20), mbps(tookConsume), tookConsume.Round(time.Millisecond))
			// The bound of TestCLIProduceConsumeS3OneGiB: streaming, with
			// a sealer's two 256 KiB segments more. A command that held
			// the payload would need at least its size.
			const limit = 256 << 20
			if rssProduce > limit || rssConsume > limit {
				t.Fatalf("peak RSS produce %d, consume %d bytes: over %d, the payload is being held in memory", rssProduce, rssConsume, limit)
			}
		})
	}
}

// epTopic produces n offloaded records (3 MiB values) to a new topic with
// e and returns the topic, the values, the references as Kafka holds them
// and the files of their objects in the file store.
func epTopic(t *testing.T, e *env, n int, seed uint64) (topic string, values [][]byte, refs []*kgo.Record, files []string) {
	t.Helper()
	topic = newTopic(t, nil)
	for i := range n {
		v := randomBytes(seed+uint64(i), 3<<20)
		values = append(values, v)
		produceOK(t, e, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: bytes.Clone(v)})
	}
	refs = consumeRaw(t, topic, n)
	for i, r := range refs {
		if !largemessage.IsOffloaded(r) || r.Offset != int64(i) {
			t.Fatalf("record %d at offset %d: offloaded %v", i, r.Offset, largemessage.IsOffloaded(r))
		}
		ref, err := largemessage.DecodeReference(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		f, ok := strings.CutPrefix(ref.FullPayloadPath, "file://")
		if !ok {
			t.Fatalf("reference %s is not a file store's", ref.FullPayloadPath)
		}
		files = append(files, f)
	}
	return topic, values, refs, files
}

// epCheckRefused checks that each record of got failed to resolve with
// want[i] (errors.Is), as a *largemessage.RecordError naming topic, partition
// and offset, and that the record still holds its reference as fetched (ref)
// and never a payload.
func epCheckRefused(t *testing.T, label string, got []largemessage.Record, refs []*kgo.Record, values [][]byte, want []error) {
	t.Helper()
	for i, r := range got {
		var re *largemessage.RecordError
		if !errors.Is(r.Err, want[i]) || !errors.As(r.Err, &re) {
			t.Fatalf("%s: record %d: %v, want %v", label, i, r.Err, want[i])
		}
		if re.Topic != refs[i].Topic || re.Partition != refs[i].Partition || re.Offset != refs[i].Offset ||
			!strings.Contains(r.Err.Error(), fmt.Sprintf("topic %s partition %d offset %d", refs[i].Topic, refs[i].Partition, refs[i].Offset)) {
			t.Fatalf("%s: record %d: the error does not name its topic, partition and offset: %v", label, i, r.Err)
		}
		if re.Skipped || !bytes.Equal(r.Value, refs[i].Value) || !largemessage.IsOffloaded(r.Record) || bytes.Equal(r.Value, values[i]) {
			t.Fatalf("%s: record %d: a failed resolve changed the record (%d value bytes)", label, i, len(r.Value))
		}
		if i == 0 {
			t.Logf("%s: %v", label, r.Err)
		}
	}
}

// epStreamRefused opens each record's value as a stream (OpenValue, as
// ferry consume does) and reads it to the end: it must fail with want[i], and
// what came before the failure must be a prefix of the true value, never
// other bytes.
func epStreamRefused(t *testing.T, label string, cfg largemessage.Config, refs []*kgo.Record, values [][]byte, want []error) {
	t.Helper()
	store, err := cfg.OpenStoreForReading(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	de := cfg.NewDeserializer(store)
	for i, ref := range refs {
		r := &kgo.Record{Topic: ref.Topic, Partition: ref.Partition, Offset: ref.Offset, Key: ref.Key,
			Value: bytes.Clone(ref.Value), Headers: ref.Headers}
		var got []byte
		rc, _, err := de.OpenValue(ctxT(t, time.Minute), r)
		if err == nil {
			got, err = io.ReadAll(rc)
			rc.Close()
		}
		var re *largemessage.RecordError
		if !errors.Is(err, want[i]) || !errors.As(err, &re) || re.Offset != ref.Offset {
			t.Fatalf("%s, streamed: record %d: %v after %d bytes, want %v naming offset %d", label, i, err, len(got), want[i], ref.Offset)
		}
		if len(got) >= len(values[i]) || !bytes.Equal(got, values[i][:len(got)]) {
			t.Fatalf("%s, streamed: record %d: %d bytes before the error are not a prefix of the value", label, i, len(got))
		}
	}
}

// epCLIRefused runs `ferry consume` (in process) of topic's n records with
// the -X args given and checks that it exits 1 with a message naming the
// topic, offset 0 and wantText, and writes no file.
func epCLIRefused(t *testing.T, topic, storeURL string, n int, wantText string, args ...string) {
	t.Helper()
	outDir := t.TempDir()
	var out, errb bytes.Buffer
	a := append([]string{"consume", "--brokers", brokers(t), "--topic", topic, "--store", storeURL, "--out", outDir,
		"-n", fmt.Sprint(n), "--timeout", "20s"}, args...)
	code := cli.Run(ctxT(t, 2*time.Minute), a, &out, &errb)
	msg := strings.TrimSpace(errb.String())
	if code != cli.ExitFailure || !strings.Contains(msg, "topic "+topic+" partition 0 offset 0") || !strings.Contains(msg, wantText) {
		t.Fatalf("ferry consume: exit %d, stderr %q; want exit %d naming %s offset 0 and %q", code, msg, cli.ExitFailure, topic, wantText)
	}
	left, _ := os.ReadDir(outDir)
	if len(left) != 0 {
		t.Fatalf("ferry consume left %d files in --out (%s...)", len(left), left[0].Name())
	}
	t.Logf("ferry consume: exit %d: %s", code, msg)
}

// Sealed objects altered on disk, read by a real consumer (franz-go records
// from the real broker, largemessage.Consumer): a byte flipped mid-object, a
// truncation (mid-segment and at a segment boundary), two objects of the same
// topic and key swapped, an object of another topic put in its place, and the
// plaintext itself put in place are each refused with a typed error naming
// the record, and the record keeps its reference; streamed, no byte that is
// not the value's comes out. A consumer with another key only, or with no
// encryption configured, is refused too. ferry consume exits 1 on each, with
// the error, and writes no file.
func TestEncryptedPayloadTamper(t *testing.T) {
	brokers(t)
	key, other := storetest.KMSKeyURL(t, ""), storetest.KMSKeyURL(t, "other")
	dir := t.TempDir()
	storeURL := "file://" + dir
	cfg := epConfig(storeURL, key)
	e := envWith(t, cfg)
	raw := openStore(t, storeURL)
	write := func(f string, b []byte) {
		t.Helper()
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(f string) []byte {
		t.Helper()
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	intact, intactValues, intactRefs, intactFiles := epTopic(t, e, 1, 100)
	if got := epConsume(t, cfg, intact, 1); got[0].Err != nil || !bytes.Equal(got[0].Value, intactValues[0]) {
		t.Fatalf("the intact record: %v", got[0].Err)
	}
	epSealedAtRest(t, raw, "file://"+intactFiles[0], int64(len(intactValues[0])), intactValues[0][1<<20:1<<20+64])
	// The first segment ends at the Ferry header, then 256 KiB on.
	segEnd := func(sealed []byte, k int) int {
		return envelope.FixedHeaderBytes + (int(sealed[22])<<8 | int(sealed[23])) + k*envelope.DefaultSegmentBytes
	}

	cases := []struct {
		name   string
		n      int
		tamper func(files []string, values [][]byte)
		want   error
		text   string // in ferry consume's message
	}{
		{"a byte flipped mid-object", 1, func(f []string, _ [][]byte) {
			b := read(f[0])
			b[len(b)/2] ^= 0x01
			write(f[0], b)
		}, envelope.ErrAuthentication, "does not authenticate"},
		{"truncated mid-segment", 1, func(f []string, _ [][]byte) {
			b := read(f[0])
			write(f[0], b[:len(b)-1000])
		}, envelope.ErrAuthentication, "does not authenticate"},
		{"truncated at a segment boundary", 1, func(f []string, _ [][]byte) {
			b := read(f[0])
			write(f[0], b[:segEnd(b, 2)])
		}, envelope.ErrAuthentication, "does not authenticate"},
		{"two objects of the topic swapped", 2, func(f []string, _ [][]byte) {
			a, b := read(f[0]), read(f[1])
			write(f[0], b)
			write(f[1], a)
		}, envelope.ErrAuthentication, "does not authenticate"},
		{"an object of another topic put in its place", 1, func(f []string, _ [][]byte) {
			write(f[0], read(intactFiles[0]))
		}, envelope.ErrAuthentication, "does not authenticate"},
		{"its plaintext put in its place", 1, func(f []string, v [][]byte) {
			write(f[0], v[0])
		}, payloadstore.ErrPlaintextRefused, "not encrypted"},
	}
	for i, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			topic, values, refs, files := epTopic(t, e, c.n, uint64(200+10*i))
			c.tamper(files, values)
			want := make([]error, c.n)
			for j := range want {
				want[j] = c.want
			}
			epCheckRefused(t, c.name, epConsume(t, cfg, topic, c.n), refs, values, want)
			epStreamRefused(t, c.name, cfg, refs, values, want)
			epCLIRefused(t, topic, storeURL, c.n, c.text, "-X", largemessage.KeyEncryptionKeyURL+"="+key)
		})
	}

	// The intact record, read with the wrong configuration. With another
	// key only: the header names a key this consumer does not have. (KMS
	// itself would unwrap the data key for it: gocloud's awskms sends no
	// KeyId with Decrypt; Ferry's key id check is what refuses.)
	t.Run("another_key_only", func(t *testing.T) {
		wrong := epConfig(storeURL, other)
		want := []error{envelope.ErrUnknownKey}
		epCheckRefused(t, "another key", epConsume(t, wrong, intact, 1), intactRefs, intactValues, want)
		epStreamRefused(t, "another key", wrong, intactRefs, intactValues, want)
		epCLIRefused(t, intact, storeURL, 1, "not configured", "-X", largemessage.KeyEncryptionKeyURL+"="+other)
		// Decryption keys only, the other one among them: the same.
		dec := epConfig(storeURL, "", other)
		epCheckRefused(t, "decryption with another key", epConsume(t, dec, intact, 1), intactRefs, intactValues, want)
	})
	// Without encryption the sealed object is longer than the record's
	// size header says.
	t.Run("no_encryption_configured", func(t *testing.T) {
		plain := epConfig(storeURL, "")
		want := []error{largemessage.ErrSizeMismatch}
		epCheckRefused(t, "no encryption", epConsume(t, plain, intact, 1), intactRefs, intactValues, want)
		epCLIRefused(t, intact, storeURL, 1, "size does not match")
		// Streamed (OpenValue, ferry consume to standard output), the
		// size check fails only once more bytes than the size header
		// came: the ciphertext up to that size comes out first, as any
		// payload's bytes do before a digest mismatch (docs: "a value
		// streams out as it is read"). Logged, not asserted.
		store, err := plain.OpenStoreForReading(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		r := *intactRefs[0]
		r.Value = bytes.Clone(r.Value)
		rc, _, err := plain.NewDeserializer(store).OpenValue(ctxT(t, time.Minute), &r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if !errors.Is(err, largemessage.ErrSizeMismatch) {
			t.Fatalf("streamed without encryption: %v, want ErrSizeMismatch", err)
		}
		t.Logf("streamed without encryption: %d bytes (sealed: %v) before %v", len(got), envelope.IsSealed(got), err)
	})
	// After all that, the intact record still reads.
	if got := epConsume(t, cfg, intact, 1); got[0].Err != nil || !bytes.Equal(got[0].Value, intactValues[0]) {
		t.Fatalf("the intact record at the end: %v", got[0].Err)
	}
}

// Key rotation: payloads sealed under the old key are read by a consumer
// whose key.url is the new key and whose decrypt.key.urls names the old one,
// library and ferry consume alike; without the old key they are refused
// with ErrUnknownKey, although KMS would unwrap their data keys for any
// keeper (awskms sends no KeyId): Ferry's key id check refuses them.
func TestEncryptedPayloadKeyRotation(t *testing.T) {
	brokers(t)
	key, old := storetest.KMSKeyURL(t, ""), storetest.KMSKeyURL(t, "old")
	dir := t.TempDir()
	storeURL := "file://" + dir
	e := envWith(t, epConfig(storeURL, old))
	topic, values, refs, _ := epTopic(t, e, 2, 300)

	rotated := epConfig(storeURL, key, old)
	for i, r := range epConsume(t, rotated, topic, 2) {
		if r.Err != nil || !bytes.Equal(r.Value, values[i]) {
			t.Fatalf("record %d with the old key among the decryption keys: %v", i, r.Err)
		}
	}
	outDir := t.TempDir()
	var out, errb bytes.Buffer
	if code := cli.Run(ctxT(t, 2*time.Minute), []string{"consume", "--brokers", brokers(t), "--topic", topic, "--store", storeURL,
		"--out", outDir, "-n", "2", "-X", largemessage.KeyEncryptionKeyURL + "=" + key,
		"-X", largemessage.KeyEncryptionDecryptKeyURLs + "=" + old}, &out, &errb); code != 0 {
		t.Fatalf("ferry consume with decrypt.key.urls: exit %d: %s", code, errb.String())
	}
	for i, r := range refs {
		got, err := os.ReadFile(filepath.Join(outDir, fmt.Sprintf("%s-%d-%d", topic, r.Partition, r.Offset)))
		if err != nil || !bytes.Equal(got, values[i]) {
			t.Fatalf("ferry consume wrote record %d: %d bytes, %v", i, len(got), err)
		}
	}

	dropped := epConfig(storeURL, key)
	want := []error{envelope.ErrUnknownKey, envelope.ErrUnknownKey}
	epCheckRefused(t, "old key dropped", epConsume(t, dropped, topic, 2), refs, values, want)
	epCLIRefused(t, topic, storeURL, 2, "not configured", "-X", largemessage.KeyEncryptionKeyURL+"="+key)
	// A new producer on the new key: the consumer that dropped the old key
	// reads its records.
	e2 := envWith(t, epConfig(storeURL, key))
	topic2, values2, _, _ := epTopic(t, e2, 1, 310)
	if got := epConsume(t, dropped, topic2, 1); got[0].Err != nil || !bytes.Equal(got[0].Value, values2[0]) {
		t.Fatalf("a record sealed under the new key: %v", got[0].Err)
	}
}

// epFiles lists the regular files under dir (temporary files included).
func epFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// epFaults are the KMS outages the fault proxy makes: it drops connections
// unanswered, answers 503, or answers nothing for an hour (the store's
// timeout, large.message.payload.store.timeout.ms, ends the wait).
var epFaults = []struct {
	name string
	mode faultproxy.Mode
}{{"KMS drops connections", faultproxy.Down}, {"KMS answers 503", faultproxy.Throttle}, {"KMS hangs", faultproxy.Slow}}

// The KMS is unreachable (a fault proxy in front of it drops connections,
// then answers 503, then hangs) while a producer (largemessage.Producer,
// real broker) offloads its first record: the produce fails with an error
// wrapping envelope.ErrKMS (a hung KMS within the store's timeout), nothing
// is appended and nothing is left in the store.
// Once the KMS is back the same produce succeeds. A later outage does not
// stop produces while the topic's data key is cached, and a consumer that has
// the data key yet to unwrap gets ErrKMS for the record, which it reads once
// the KMS is back.
func TestEncryptedPayloadKMSOutageProduce(t *testing.T) {
	brokers(t)
	via, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	dir := t.TempDir()
	storeURL := "file://" + dir
	fp.SetDelay(time.Hour) // faultproxy.Slow
	cfg := epConfig(storeURL, via)
	cfg.Policy.Timeout = 3 * time.Second
	cfg.Policy.RetryCount = 1
	cfg.Policy.RetryBackoff = 10 * time.Millisecond
	cfg.Policy.RetryMaxBackoff = 100 * time.Millisecond
	e := envWith(t, cfg)
	raw := openStore(t, storeURL)
	topic := newTopic(t, nil)
	value := randomBytes(400, 3<<20)

	for _, fault := range epFaults {
		fp.Set(fault.mode, -1)
		seen := fp.Count(fault.mode)
		start := time.Now()
		err := e.prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Topic: topic, Value: bytes.Clone(value)}).FirstErr()
		var ke *envelope.KMSError
		if !errors.Is(err, envelope.ErrKMS) || !errors.As(err, &ke) || ke.Op != "wrap" {
			t.Fatalf("%s: produce error %v, want one wrapping envelope.ErrKMS (wrap)", fault.name, err)
		}
		if fp.Count(fault.mode) == seen {
			t.Fatalf("%s: the fault proxy saw no request", fault.name)
		}
		if off := endOffset(t, topic); off != 0 {
			t.Fatalf("%s: end offset %d: a record was appended although its payload was not sealed", fault.name, off)
		}
		if left := epFiles(t, dir); len(left) != 0 {
			t.Fatalf("%s: files left in the store: %v", fault.name, left)
		}
		t.Logf("%s: produce failed after %v (retryable %v): %v", fault.name, time.Since(start).Round(time.Millisecond), ke.Retryable, err)
	}

	fp.Set(faultproxy.Pass, -1)
	produceOK(t, e, &kgo.Record{Topic: topic, Value: bytes.Clone(value)})
	if off := endOffset(t, topic); off != 1 {
		t.Fatalf("end offset %d after the KMS came back, want 1", off)
	}
	objs := objectsUnder(t, raw, topic)
	if len(objs) != 1 {
		t.Fatalf("objects %v, want one", objs)
	}
	epSealedAtRest(t, raw, objs[0], int64(len(value)), value[2<<20:2<<20+64])

	// The topic's data key is cached: no KMS call, so no outage either.
	fp.Set(faultproxy.Down, -1)
	down := fp.Count(faultproxy.Down)
	produceOK(t, e, &kgo.Record{Topic: topic, Value: bytes.Clone(value)})
	if n := fp.Count(faultproxy.Down) - down; n != 0 || endOffset(t, topic) != 2 {
		t.Fatalf("a produce with the data key cached called the KMS %d times (end offset %d)", n, endOffset(t, topic))
	}

	// A consumer of its own (nothing cached) during the outage.
	cons := epConfig(storeURL, via)
	cons.Policy = cfg.Policy
	got := epConsume(t, cons, topic, 2)
	raws := consumeRaw(t, topic, 2)
	epCheckRefused(t, "consume during the outage", got, raws, [][]byte{value, value}, []error{envelope.ErrKMS, envelope.ErrKMS})
	fp.Set(faultproxy.Pass, -1)
	for i, r := range epConsume(t, cons, topic, 2) {
		if r.Err != nil || !bytes.Equal(r.Value, value) {
			t.Fatalf("record %d once the KMS is back: %v", i, r.Err)
		}
	}
}

// The same outage through a `ferry proxy` process whose large-message
// interceptor seals payloads under the key reached through the fault proxy:
// a large record's produce is refused (KAFKA_STORAGE_ERROR), nothing is
// appended or stored; once the KMS is back the record goes through, is
// sealed at rest and reads back through the proxy.
func TestEncryptedPayloadKMSOutageProxy(t *testing.T) {
	b := brokers(t)
	via, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	fp.SetDelay(time.Hour) // faultproxy.Slow
	dir := t.TempDir()
	storeURL := "file://" + dir
	topic := newTopic(t, nil)
	start := time.Now()
	bin := buildFerry(t)
	t.Logf("built ferry in %v", time.Since(start).Round(time.Millisecond))
	p := startFerryProxy(t, bin, fmt.Sprintf(`
upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
interceptors:
  - name: large-message
    config:
      topic.pattern: %q
      large.message.payload.store.url: %q
      large.message.payload.encryption.key.url: %q
      large.message.payload.store.timeout.ms: 3000
      large.message.payload.store.retry.count: 1
      large.message.payload.store.retry.backoff.ms: 10
      large.message.payload.store.retry.max.backoff.ms: 50
`, b, topic, storeURL, via))
	// MetadataMinAge: franz-go refreshes metadata before it retries a
	// KAFKA_STORAGE_ERROR, by default at most every 5 s.
	prod := viaClient(t, p.bootstrap, kgo.DefaultProduceTopic(topic), kgo.RecordRetries(1), kgo.ProducerBatchMaxBytes(8<<20),
		kgo.RecordDeliveryTimeout(40*time.Second), kgo.MetadataMinAge(250*time.Millisecond))
	value := randomBytes(500, 3<<20)

	for _, fault := range epFaults {
		fp.Set(fault.mode, -1)
		seen := fp.Count(fault.mode)
		start := time.Now()
		err := prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Value: bytes.Clone(value)}).FirstErr()
		if !errors.Is(err, kerr.KafkaStorageError) {
			t.Fatalf("%s: produce through the proxy: %v, want KAFKA_STORAGE_ERROR", fault.name, err)
		}
		if fp.Count(fault.mode) == seen {
			t.Fatalf("%s: the fault proxy saw no request from the ferry proxy", fault.name)
		}
		if off := endOffset(t, topic); off != 0 {
			t.Fatalf("%s: end offset %d, want 0: nothing may be appended", fault.name, off)
		}
		if left := epFiles(t, dir); len(left) != 0 {
			t.Fatalf("%s: files left in the store: %v", fault.name, left)
		}
		t.Logf("%s: produce through the ferry proxy failed after %v: %v", fault.name, time.Since(start).Round(time.Millisecond), err)
	}
	fp.Set(faultproxy.Pass, -1)
	if err := prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Value: bytes.Clone(value)}).FirstErr(); err != nil {
		t.Fatalf("produce once the KMS is back: %v", err)
	}
	if off := endOffset(t, topic); off != 1 {
		t.Fatalf("end offset %d, want 1", off)
	}
	raw := openStore(t, storeURL)
	objs := objectsUnder(t, raw, topic)
	if len(objs) != 1 {
		t.Fatalf("objects %v, want one", objs)
	}
	epSealedAtRest(t, raw, objs[0], int64(len(value)), value[1<<20:1<<20+64])
	got := proxyRecords(t, p.bootstrap, topic, 1)
	if got[0].Offset != 0 || !bytes.Equal(got[0].Value, value) || len(got[0].Headers) != 0 {
		t.Fatalf("read back through the proxy: offset %d, %d bytes, headers %v", got[0].Offset, len(got[0].Value), got[0].Headers)
	}
}

// kcat, the Java console producer and consumer, and Python confluent-kafka
// produce records larger than their topic's max.message.bytes through the
// proxy's large-message interceptor with payload encryption on (the real
// KMS's key), and consume them back byte for byte with their headers; the
// broker holds references, the objects in the store are sealed, and the Go
// library with the same key reads them straight from the broker.
func TestEncryptedPayloadClientsProxy(t *testing.T) {
	key := storetest.KMSKeyURL(t, "")
	brokers(t)
	storeURL := interceptorStoreURL(t)
	via := interceptorProxy(t, 0, largeMessageSpec("ferry-cl-testencryptedpayloadclientsproxy-.*", storeURL,
		largemessage.KeyEncryptionKeyURL+"="+key))
	raw := openStore(t, storeURL)
	const maxMessage = 100_000
	limit := fmt.Sprint(maxMessage)
	clients := []struct {
		name    string
		need    func(testing.TB) string
		produce func(t *testing.T, topic string, recs []clientRecord)
		consume func(t *testing.T, topic string, n int) []clientRecord
	}{
		{"kcat", kcatPath, func(t *testing.T, topic string, recs []clientRecord) {
			kcatProduce(t, via, topic, recs, recs[0].Headers)
		}, func(t *testing.T, topic string, n int) []clientRecord {
			return kcatConsume(t, via, topic)
		}},
		{"java", kafkaToolsCP, func(t *testing.T, topic string, recs []clientRecord) {
			// The console producer's request.timeout.ms is 1500 ms: short
			// for a first KMS call and a store write on a busy machine.
			javaProduce(t, via, topic, recs, "--command-property", "request.timeout.ms=30000",
				"--command-property", "delivery.timeout.ms=60000")
		}, func(t *testing.T, topic string, n int) []clientRecord {
			return javaConsume(t, via, topic, n)
		}},
		{"python", pythonPath, func(t *testing.T, topic string, recs []clientRecord) {
			pyProduce(t, via, topic, recs)
		}, func(t *testing.T, topic string, n int) []clientRecord {
			return pyConsume(t, via, topic)
		}},
	}
	for ci, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			c.need(t)
			topic := clientTopic(t, 1, map[string]*string{"max.message.bytes": &limit})
			headers := []clientHeader{{Key: "client", Value: []byte(c.name)}}
			sizes := map[string]int{c.name + "-large-a": 3 * maxMessage, c.name + "-small": 200, c.name + "-large-b": 5 * maxMessage / 2}
			var want []clientRecord
			values := map[string][]byte{}
			offloaded := map[string]bool{}
			for i, k := range []string{c.name + "-large-a", c.name + "-small", c.name + "-large-b"} {
				v := printable(uint64(600+10*ci+i), sizes[k])
				want = append(want, clientRecord{Key: []byte(k), Value: v, Headers: headers})
				values[k], offloaded[k] = v, sizes[k] > maxMessage
			}
			c.produce(t, topic, want)
			sameRecords(t, c.name+" consume through the proxy", c.consume(t, topic, len(want)), want)

			refs := checkReferences(t, topic, len(want), offloaded, values)
			for _, r := range refs {
				if !offloaded[string(r.Key)] {
					continue
				}
				ref, err := largemessage.DecodeReference(r.Value)
				if err != nil {
					t.Fatal(err)
				}
				v := values[string(r.Key)]
				epSealedAtRest(t, raw, ref.FullPayloadPath, int64(len(v)), v[len(v)/2:len(v)/2+64])
			}
			lib := epConfig(storeURL, key)
			for _, r := range epConsume(t, lib, topic, len(want)) {
				if r.Err != nil || !bytes.Equal(r.Value, values[string(r.Key)]) {
					t.Fatalf("Go library from the broker, record %q: %v", r.Key, r.Err)
				}
			}
		})
	}
}

// kmsCalls counts the requests a fault proxy in front of the KMS passed on.
func kmsCalls(fp *faultproxy.Proxy) int { return fp.Count(faultproxy.Pass) }

// The data key's bounds, set as properties (largemessage.ParseConfig), as
// the real KMS sees them: with data.key.max.uses=2, five payloads of a topic
// take three wraps; with data.key.max.age.ms=1500, a payload sealed after
// that long takes a new one. A consumer unwraps each data key once, not once
// per payload.
func TestEncryptedPayloadDataKeyReuse(t *testing.T) {
	brokers(t)
	via, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	dir := t.TempDir()
	storeURL := "file://" + dir
	parse := func(kv ...string) largemessage.Config {
		t.Helper()
		p := map[string]string{largemessage.KeyStoreURL: storeURL, largemessage.KeyEncryptionKeyURL: via}
		for _, s := range kv {
			k, v, _ := strings.Cut(s, "=")
			p[k] = v
		}
		cfg, err := largemessage.ParseConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	produce := func(e *env, topic string, n int, seed uint64) [][]byte {
		t.Helper()
		var vs [][]byte
		for i := range n {
			v := randomBytes(seed+uint64(i), 3<<19)
			vs = append(vs, v)
			produceOK(t, e, &kgo.Record{Topic: topic, Value: bytes.Clone(v)})
		}
		return vs
	}

	byUses := newTopic(t, nil)
	before := kmsCalls(fp)
	values := produce(envWith(t, parse(largemessage.KeyEncryptionDataKeyMaxUses+"=2")), byUses, 5, 700)
	if n := kmsCalls(fp) - before; n != 3 {
		t.Fatalf("5 payloads with data.key.max.uses=2: %d KMS calls, want 3", n)
	}

	byAge := newTopic(t, nil)
	e := envWith(t, parse(largemessage.KeyEncryptionDataKeyMaxAge+"=1500"))
	before = kmsCalls(fp)
	produce(e, byAge, 2, 710)
	if n := kmsCalls(fp) - before; n != 1 {
		t.Fatalf("2 payloads within data.key.max.age.ms: %d KMS calls, want 1", n)
	}
	time.Sleep(1600 * time.Millisecond)
	produce(e, byAge, 1, 720)
	if n := kmsCalls(fp) - before; n != 2 {
		t.Fatalf("a payload after data.key.max.age.ms: %d KMS calls in all, want 2", n)
	}

	// A consumer of its own (nothing cached) through another fault proxy.
	cvia, cfp := storetest.KMSKeyURLViaFaultProxy(t, "")
	ccfg := epConfig(storeURL, cvia)
	for i, r := range epConsume(t, ccfg, byUses, 5) {
		if r.Err != nil || !bytes.Equal(r.Value, values[i]) {
			t.Fatalf("record %d: %v", i, r.Err)
		}
	}
	if n := kmsCalls(cfp); n != 1+3 {
		t.Fatalf("a consumer of 5 payloads under 3 data keys made %d KMS calls, want 4 (3 Decrypt and the DescribeKey that checks the key they name)", n)
	}
}

// Turning encryption on in a topic that has payloads stored before: with
// allow.plaintext=true a consumer reads the old plaintext object and the new
// sealed one (library and ferry consume); without it the plaintext object is
// refused with ErrPlaintextRefused and the sealed one still reads.
func TestEncryptedPayloadAllowPlaintext(t *testing.T) {
	brokers(t)
	key := storetest.KMSKeyURL(t, "")
	dir := t.TempDir()
	storeURL := "file://" + dir
	topic := newTopic(t, nil)
	values := [][]byte{randomBytes(800, 3<<20), randomBytes(801, 3<<20)}
	produceOK(t, envWith(t, epConfig(storeURL, "")), &kgo.Record{Topic: topic, Value: bytes.Clone(values[0])})
	produceOK(t, envWith(t, epConfig(storeURL, key)), &kgo.Record{Topic: topic, Value: bytes.Clone(values[1])})
	refs := consumeRaw(t, topic, 2)
	raw := openStore(t, storeURL)
	for i, r := range refs {
		ref, err := largemessage.DecodeReference(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		b, err := payloadstore.DownloadBytes(context.Background(), raw, ref.FullPayloadPath)
		if err != nil {
			t.Fatal(err)
		}
		if sealed := envelope.IsSealed(b); sealed != (i == 1) {
			t.Fatalf("record %d: the object at rest is sealed: %v", i, sealed)
		}
	}

	allow := epConfig(storeURL, key)
	allow.AllowPlaintext = true
	for i, r := range epConsume(t, allow, topic, 2) {
		if r.Err != nil || !bytes.Equal(r.Value, values[i]) {
			t.Fatalf("allow.plaintext: record %d: %v", i, r.Err)
		}
	}
	strict := epConsume(t, epConfig(storeURL, key), topic, 2)
	epCheckRefused(t, "plaintext object", strict[:1], refs[:1], values[:1], []error{payloadstore.ErrPlaintextRefused})
	if strict[1].Err != nil || !bytes.Equal(strict[1].Value, values[1]) {
		t.Fatalf("the sealed record without allow.plaintext: %v", strict[1].Err)
	}

	outDir := t.TempDir()
	var out, errb bytes.Buffer
	if code := cli.Run(ctxT(t, 2*time.Minute), []string{"consume", "--brokers", brokers(t), "--topic", topic, "--store", storeURL,
		"--out", outDir, "-n", "2", "-X", largemessage.KeyEncryptionKeyURL + "=" + key,
		"-X", largemessage.KeyEncryptionAllowPlaintext + "=true"}, &out, &errb); code != 0 {
		t.Fatalf("ferry consume with allow.plaintext: exit %d: %s", code, errb.String())
	}
	for i, r := range refs {
		got, err := os.ReadFile(filepath.Join(outDir, fmt.Sprintf("%s-%d-%d", topic, r.Partition, r.Offset)))
		if err != nil || !bytes.Equal(got, values[i]) {
			t.Fatalf("ferry consume wrote record %d: %d bytes, %v", i, len(got), err)
		}
	}
	epCLIRefused(t, topic, storeURL, 2, "not encrypted", "-X", largemessage.KeyEncryptionKeyURL+"="+key)
}

// A sealed object altered at rest, fetched through the proxy's
// large-message interceptor with encryption: the records before it come
// back, its partition then fails with CORRUPT_MESSAGE (the bytes will never
// authenticate: the Java consumer throws naming the offset, franz-go
// fetches it again), and no consumer ever sees it with other bytes or as a
// reference.
func TestEncryptedPayloadTamperProxy(t *testing.T) {
	brokers(t)
	key := storetest.KMSKeyURL(t, "")
	dir := t.TempDir()
	storeURL := "file://" + dir
	topic := clientTopic(t, 1, nil)
	srv := startProxyServer(t, proxy.Config{Upstream: proxy.SplitList(brokers(t)),
		Interceptors: []interceptor.Spec{largeMessageSpec(topic, storeURL, largemessage.KeyEncryptionKeyURL+"="+key)}})
	via := srv.Addr()
	// failed counts the fetches of the partition the proxy failed.
	failed := func() float64 {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		var n float64
		for line := range strings.Lines(rec.Body.String()) {
			if strings.HasPrefix(line, "ferry_interceptor_rejections_total{") && strings.Contains(line, `direction="fetch"`) &&
				strings.Contains(line, `reason="CORRUPT_MESSAGE"`) && strings.Contains(line, `topic="`+topic+`"`) {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				n += v
			}
		}
		return n
	}
	prod := viaClient(t, via, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(8<<20))
	values := [][]byte{randomBytes(900, 3<<20), randomBytes(901, 3<<20)}
	for _, v := range values {
		if err := prod.ProduceSync(ctxT(t, time.Minute), &kgo.Record{Value: bytes.Clone(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	refs := consumeRaw(t, topic, 2)
	ref, err := largemessage.DecodeReference(refs[1].Value)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.TrimPrefix(ref.FullPayloadPath, "file://")
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}

	cl := viaClient(t, via, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20), kgo.MetadataMinAge(250*time.Millisecond))
	// franz-go retries CORRUPT_MESSAGE without telling (kerr counts it
	// retriable): the proxy's metrics show the failed fetches.
	deadline := time.Now().Add(30 * time.Second)
	var got []*kgo.Record
	for failed() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d records, %v failed fetches", len(got), failed())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kerr.CorruptMessage) {
				t.Fatalf("fetch error %v", err)
			}
		})
		got = append(got, fs.Records()...)
	}
	if len(got) != 1 || got[0].Offset != 0 || !bytes.Equal(got[0].Value, values[0]) || len(got[0].Headers) != 0 {
		t.Fatalf("records through the proxy: %d (want the intact one at offset 0 only)", len(got))
	}
	t.Logf("the intact record came back, then %v fetches of the altered one failed with CORRUPT_MESSAGE", failed())
}
