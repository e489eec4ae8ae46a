package integration

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferrykit/ferry/internal/cli"
	"github.com/ferrykit/ferry/internal/kafkaconf"
	"github.com/ferrykit/ferry/internal/props"
	"github.com/ferrykit/ferry/largemessage"
)

// Every Ferry client against a real broker's SASL_SSL listener (SCRAM over
// TLS with a test CA; scripts/kafka-broker with FERRY_KAFKA_SASL_SSL=1:
// the shared broker of scripts/test, or one of the test's own) with
// ferry produce/consume/gc with a Java-style client.properties (PKCS12
// trust store, sasl.jaas.config, SCRAM-SHA-512) and a librdkafka-style one
// (ssl.ca.location, sasl.username, SCRAM-SHA-256); a wrong password and a
// missing CA fail with a clear error and exit 1; OAUTHBEARER with a token
// file (a bad token is refused by the broker); and `ferry proxy` with the
// large-message interceptor over that listener, whose own admin client logs
// in to read max.message.bytes for its size check.
func TestSASLSSL(t *testing.T) {
	brokers(t)
	env := map[string]string{}
	for _, k := range []string{"FERRY_KAFKA_SASL_SSL_BROKERS", "FERRY_KAFKA_CA", "FERRY_KAFKA_TRUSTSTORE", "FERRY_KAFKA_TRUSTSTORE_PASSWORD"} {
		env[k] = os.Getenv(k)
	}
	if env["FERRY_KAFKA_SASL_SSL_BROKERS"] == "" { // scripts/test's broker has the listener; else start one
		env = ownBrokerEnv(t, "FERRY_KAFKA_SASL_SSL=1")
	}
	addr := env["FERRY_KAFKA_SASL_SSL_BROKERS"]
	if addr == "" || env["FERRY_KAFKA_CA"] == "" || env["FERRY_KAFKA_TRUSTSTORE"] == "" {
		t.Fatalf("the broker has no SASL_SSL listener: %v", env)
	}
	dir := t.TempDir()
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36) // topics new on a reused broker
	styles := map[string]string{
		"java": fmt.Sprintf(`bootstrap.servers=%s
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="alice" password="alice-secret";
ssl.truststore.location=%s
ssl.truststore.password=%s
ssl.truststore.type=PKCS12
`, addr, env["FERRY_KAFKA_TRUSTSTORE"], env["FERRY_KAFKA_TRUSTSTORE_PASSWORD"]),
		"librdkafka": fmt.Sprintf(`bootstrap.servers=%s
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-256
sasl.username=alice
sasl.password=alice-secret
ssl.ca.location=%s
`, addr, env["FERRY_KAFKA_CA"]),
	}
	files := map[string]string{}
	for style, text := range styles {
		files[style] = filepath.Join(dir, style+".properties")
		if err := os.WriteFile(files[style], []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A client of the test's own, through the same mapping (kafkaconf).
	p, err := props.Load(files["librdkafka"], nil)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := kafkaconf.Parse(p)
	if err != nil {
		t.Fatal(err)
	}
	direct := func(t *testing.T, opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(addr)}, sec.Opts()...), opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}

	for _, style := range []string{"java", "librdkafka"} {
		t.Run("cli "+style, func(t *testing.T) {
			cliRoundTripAndGC(t, files[style], "sec-cli-"+style+"-"+suffix, direct(t))
		})
	}

	t.Run("wrong password", func(t *testing.T) {
		for _, args := range [][]string{
			{"--config", files["librdkafka"], "-X", "sasl.password=wrong"},
			{"--config", files["java"], "-X", `sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="wrong";`},
		} {
			var out, errb bytes.Buffer
			code := cli.Run(ctxT(t, time.Minute), append([]string{"produce", "--topic", "sec-wrong"}, append(args, files["java"])...), &out, &errb)
			if code != cli.ExitFailure || !strings.Contains(errb.String(), "login refused by Kafka at "+addr) || !strings.Contains(errb.String(), "SASL_AUTHENTICATION_FAILED") {
				t.Fatalf("%v: exit %d, stderr %q; want exit %d and the broker's SASL_AUTHENTICATION_FAILED", args, code, errb.String(), cli.ExitFailure)
			}
			t.Logf("wrong password: %s", strings.TrimSpace(errb.String()))
		}
	})
	t.Run("unknown CA", func(t *testing.T) {
		var out, errb bytes.Buffer
		code := cli.Run(ctxT(t, time.Minute), []string{"consume", "--brokers", addr, "--topic", "sec-cli-java",
			"-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=PLAIN", "-X", "sasl.username=alice", "-X", "sasl.password=alice-secret"}, &out, &errb)
		if code != cli.ExitFailure || !strings.Contains(errb.String(), "certificate signed by unknown authority") {
			t.Fatalf("exit %d, stderr %q; want exit 1 and an unknown-authority error", code, errb.String())
		}
	})
	t.Run("GSSAPI refused", func(t *testing.T) {
		var out, errb bytes.Buffer
		code := cli.Run(ctxT(t, time.Minute), []string{"consume", "--config", files["librdkafka"], "--topic", "sec-cli-java", "-X", "sasl.mechanism=GSSAPI"}, &out, &errb)
		if code != cli.ExitUsage || !strings.Contains(errb.String(), "GSSAPI (Kerberos) is not supported") {
			t.Fatalf("exit %d, stderr %q; want a usage error", code, errb.String())
		}
	})

	t.Run("oauthbearer", func(t *testing.T) {
		// Kafka's unsecured JWT (alg "none"), which the test broker's
		// listener accepts: a token file named in sasl.jaas.config, and the
		// Java style sasl.oauthbearer.token.endpoint.url=file:…
		now := time.Now().Unix()
		enc := base64.RawURLEncoding.EncodeToString
		jwt := enc([]byte(`{"alg":"none"}`)) + "." + enc(fmt.Appendf(nil, `{"sub":"alice","iat":%d,"exp":%d}`, now, now+3600)) + "."
		tokenFile := filepath.Join(dir, "token")
		if err := os.WriteFile(tokenFile, []byte(jwt+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		small := filepath.Join(dir, "small.txt")
		if err := os.WriteFile(small, []byte("over OAUTHBEARER"), 0o600); err != nil {
			t.Fatal(err)
		}
		topic := "sec-oauth-" + suffix
		base := []string{"--brokers", addr, "--topic", topic, "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=OAUTHBEARER",
			"-X", "ssl.truststore.location=" + env["FERRY_KAFKA_TRUSTSTORE"], "-X", "ssl.truststore.password=" + env["FERRY_KAFKA_TRUSTSTORE_PASSWORD"]}
		jaasFile := []string{"-X", `sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required tokenFile="` + tokenFile + `";`}
		endpoint := []string{"-X", "sasl.oauthbearer.token.endpoint.url=file://" + tokenFile}
		var out, errb bytes.Buffer
		if code := cli.Run(ctxT(t, time.Minute), append(append([]string{"produce"}, append(base, jaasFile...)...), small), &out, &errb); code != cli.ExitOK {
			t.Fatalf("produce with a token file: exit %d: %s", code, errb.String())
		}
		out.Reset()
		errb.Reset()
		if code := cli.Run(ctxT(t, time.Minute), append([]string{"consume", "-n", "1"}, append(base, endpoint...)...), &out, &errb); code != cli.ExitOK || out.String() != "over OAUTHBEARER" {
			t.Fatalf("consume with a file: token endpoint: exit %d, out %q: %s", code, out.String(), errb.String())
		}
		if err := os.WriteFile(tokenFile, []byte("not.a.jwt"), 0o600); err != nil {
			t.Fatal(err)
		}
		out.Reset()
		errb.Reset()
		code := cli.Run(ctxT(t, time.Minute), append(append([]string{"produce"}, append(base, jaasFile...)...), small), &out, &errb)
		if code != cli.ExitFailure || !strings.Contains(errb.String(), "login refused by Kafka at "+addr+" (SASL_SSL (OAUTHBEARER))") {
			t.Fatalf("a bad token: exit %d, stderr %q", code, errb.String())
		}
	})

	t.Run("proxy", func(t *testing.T) { proxyOverSASLSSL(t, env, suffix, direct) })
}

// cliRoundTripAndGC produces a 3 MiB file (over the broker's 1 MiB limit:
// offloaded) with `ferry produce --config file`, reads it back with `ferry
// consume`, and has `ferry gc` delete an orphan object of the topic while
// keeping the referenced one.
func cliRoundTripAndGC(t *testing.T, propsFile, topic string, direct *kgo.Client) {
	dir := t.TempDir()
	storeURL := "file://" + filepath.Join(dir, "store")
	src := filepath.Join(dir, "payload.bin")
	want := randomBytes(uint64(len(topic)), 3<<20)
	if err := os.WriteFile(src, want, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 3*time.Minute)
	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := cli.Run(ctx, append([]string{args[0], "--config", propsFile, "--topic", topic, "--store", storeURL}, args[1:]...), &out, &errb); code != cli.ExitOK {
			t.Fatalf("ferry %v exited %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	if out := run("produce", src); !strings.Contains(out, "3145728 bytes offloaded") {
		t.Fatalf("produce: %q", out)
	}
	// Kafka holds only the reference (read with the test's own TLS+SASL client).
	direct.AddConsumeTopics(topic)
	fs := direct.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil || len(fs.Records()) != 1 || !largemessage.IsOffloaded(fs.Records()[0]) || len(fs.Records()[0].Value) > 1024 {
		t.Fatalf("raw read: err %v, %d records", fs.Err0(), len(fs.Records()))
	}
	ref := valuePath(t, fs.Records()[0])
	outDir := filepath.Join(dir, "out")
	run("consume", "--out", outDir, "-n", "1")
	got, err := os.ReadFile(filepath.Join(outDir, filepath.Base(src))) // named after the file produce sent (ferry.file.name)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("consumed %d bytes (err %v), want the 3 MiB file", len(got), err)
	}

	store := openStore(t, storeURL)
	orphan, size := orphans(t, store, topic, 77, 1)
	if out := run("gc", "--grace", "0s", "--settle", "1s"); !strings.Contains(out, fmt.Sprintf("1 deleted, %d bytes freed", size)) {
		t.Fatalf("gc summary: %q", out)
	}
	if exists(t, store, orphan[0]) || !exists(t, store, ref) {
		t.Fatal("ferry gc did not delete exactly the orphan")
	}
}

// proxyOverSASLSSL: `ferry proxy` whose upstream is the SASL_SSL listener
// (tls.upstream.* with the test CA, upstream.sasl.* SCRAM-SHA-512). Clients
// log in through it (SCRAM-SHA-256, forwarded). Its admin client reads the
// topic's max.message.bytes (200000): a 600 KB record, under the
// interceptor's threshold (10 MiB) but over the topic's limit, is offloaded
// and the produce succeeds; a 3 MiB record too. With a wrong admin
// password the same 600 KB record is not offloaded and the broker refuses
// it (MESSAGE_TOO_LARGE): the size check is the admin client's.
func proxyOverSASLSSL(t *testing.T, env map[string]string, suffix string, direct func(*testing.T, ...kgo.Opt) *kgo.Client) {
	start := time.Now()
	bin := buildFerry(t)
	storeURL := "file://" + filepath.Join(t.TempDir(), "store")
	small, dflt := "sec-proxy-small-"+suffix, "sec-proxy-default-"+suffix
	limit := "200000"
	adm := kadm.NewClient(direct(t))
	ctx := ctxT(t, 3*time.Minute)
	for topic, cfg := range map[string]map[string]*string{small: {"max.message.bytes": &limit}, dflt: nil} {
		if resp, err := adm.CreateTopic(ctx, 1, 1, cfg, topic); err != nil || resp.Err != nil {
			t.Fatalf("create %s: %v %v", topic, err, resp.Err)
		}
	}
	yaml := func(password string) string {
		return fmt.Sprintf(`
upstream: %s
listen: 127.0.0.1:0
admin.listen: 127.0.0.1:0
tls.upstream.enabled: true
tls.upstream.ca: %s
upstream.sasl.mechanism: SCRAM-SHA-512
upstream.sasl.username: alice
upstream.sasl.password: %s
interceptors:
  - name: large-message
    config:
      topic.pattern: "sec-proxy-.*"
      large.message.payload.store.url: %s
      large.message.threshold.bytes: 10485760
`, env["FERRY_KAFKA_SASL_SSL_BROKERS"], env["FERRY_KAFKA_CA"], password, storeURL)
	}
	client := func(bootstrap string, opts ...kgo.Opt) *kgo.Client {
		return proxyClient(t, bootstrap, nil, append([]kgo.Opt{
			kgo.SASL(scram.Auth{User: "alice", Pass: "alice-secret"}.AsSha256Mechanism()),
			kgo.ProducerBatchMaxBytes(8 << 20), kgo.RecordRetries(2), kgo.RequestRetries(2)}, opts...)...)
	}

	t.Logf("ferry built, topics created: %s", time.Since(start).Round(time.Millisecond))
	p := startFerryProxy(t, bin, yaml("alice-secret"))
	cl := client(p.bootstrap)
	values := map[string][]byte{small: randomBytes(600, 600_000), dflt: randomBytes(3000, 3<<20)}
	for topic, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: v}).FirstErr(); err != nil {
			t.Fatalf("produce %d bytes to %s through the proxy: %v", len(v), topic, err)
		}
	}
	raw := direct(t, kgo.ConsumeTopics(small, dflt), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for seen := map[string]bool{}; len(seen) < 2; {
		fs := raw.PollRecords(ctx, 2)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		for _, r := range fs.Records() {
			if !largemessage.IsOffloaded(r) {
				t.Fatalf("%s holds a %d-byte inline record, want a reference", r.Topic, len(r.Value))
			}
			seen[r.Topic] = true
		}
	}
	// Fetch through the proxy resolves both.
	rd := client(p.bootstrap, kgo.ConsumeTopics(small, dflt), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(16<<20))
	for got := 0; got < 2; {
		fs := rd.PollRecords(ctx, 2)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		for _, r := range fs.Records() {
			if !bytes.Equal(r.Value, values[r.Topic]) {
				t.Fatalf("%s: read %d bytes through the proxy, not the %d produced", r.Topic, len(r.Value), len(values[r.Topic]))
			}
			got++
		}
	}

	// The control: the admin client cannot log in, so the topic's limit is
	// unknown and the broker's own check refuses the record.
	t.Logf("offloaded and resolved through the proxy: %s; starting the control", time.Since(start).Round(time.Millisecond))
	bad := startFerryProxy(t, bin, yaml("wrong"))
	err := client(bad.bootstrap).ProduceSync(ctx, &kgo.Record{Topic: small, Value: values[small]}).FirstErr()
	if !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("with a wrong admin password: %v, want MESSAGE_TOO_LARGE from the broker", err)
	}
	t.Logf("control refused (%v): %s", err, time.Since(start).Round(time.Millisecond))
}
