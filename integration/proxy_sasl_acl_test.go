package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/proxy"
)

// With SASL and ACLs on a real broker (Kafka's StandardAuthorizer), a
// client authorised only on topic A obtains no byte of topic B's payloads
// through the proxy, whatever reference it forges, and nothing is
// intercepted (no store write) before the broker authenticated the
// connection.
func TestProxySASLAndACLs(t *testing.T) {
	env := ownBrokerEnv(t, "FERRY_KAFKA_SASL=1", "FERRY_KAFKA_ACL=1")
	plainAddr, saslAddr := env["FERRY_KAFKA_BROKERS"], env["FERRY_KAFKA_SASL_BROKERS"]
	if saslAddr == "" {
		t.Fatal("the broker has no SASL listener")
	}
	ctx := context.Background()
	admin, err := kgo.NewClient(kgo.SeedBrokers(plainAddr)) // ANONYMOUS: a super user
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	topicA, topicB := "acl-a", "acl-b"
	if _, err := adm.CreateTopics(ctx, 1, 1, nil, topicA, topicB); err != nil {
		t.Fatal(err)
	}
	acl := kadm.NewACLs().Allow("User:bob").AllowHosts().Topics(topicA).
		ResourcePatternType(kadm.ACLPatternLiteral).Operations(kadm.OpRead, kadm.OpWrite, kadm.OpDescribe)
	if res, err := adm.CreateACLs(ctx, acl); err != nil || res[0].Err != nil {
		t.Fatalf("ACLs: %v %v", err, res)
	}
	storeDir := filepath.Join(t.TempDir(), "store")
	storeURL := "file://" + storeDir
	s := startProxyServer(t, proxy.Config{Upstream: []string{saslAddr},
		UpstreamSASL: proxy.SASLConfig{Mechanism: "PLAIN", Username: "alice", Password: "alice-secret"},
		Interceptors: []interceptor.Spec{{Name: "large-message", Config: map[string]string{
			interceptor.KeyTopicPattern: "acl-.*", largemessage.KeyStoreURL: storeURL}}}})
	as := func(user, pass string, opts ...kgo.Opt) *kgo.Client {
		return proxyClient(t, s.Addr(), nil, append([]kgo.Opt{kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()),
			kgo.ProducerBatchMaxBytes(8 << 20), kgo.RecordRetries(2), kgo.RequestRetries(2)}, opts...)...)
	}

	// alice (a super user) writes a large record to B: its payload is B's.
	secret := append([]byte("topic B's secret: "), randomBytes(7, 2<<20)...)
	alice := as("alice", "alice-secret")
	if err := alice.ProduceSync(ctx, &kgo.Record{Topic: topicB, Value: secret}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	raw, err := kgo.NewClient(kgo.SeedBrokers(plainAddr), kgo.ConsumeTopics(topicB), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	fs := raw.PollRecords(ctxT(t, 30*time.Second), 1)
	if len(fs.Records()) != 1 || !largemessage.IsOffloaded(fs.Records()[0]) {
		t.Fatalf("B holds %d records, want one reference", len(fs.Records()))
	}
	bRec := fs.Records()[0]

	bob := as("bob", "bob-secret", kgo.ConsumeTopics(topicA), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	t.Run("bob cannot read B", func(t *testing.T) {
		err := bob.ProduceSync(ctx, &kgo.Record{Topic: topicB, Value: []byte("x")}).FirstErr()
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Fatalf("bob writing B: %v, want TOPIC_AUTHORIZATION_FAILED", err)
		}
	})
	t.Run("bob's forged reference into B is refused", func(t *testing.T) {
		forged := &kgo.Record{Topic: topicA, Value: bRec.Value, Headers: bRec.Headers}
		err := bob.ProduceSync(ctx, forged).FirstErr()
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("a reference into B produced to A: %v, want INVALID_RECORD", err)
		}
		// Other spellings of B's object: through "..", another root.
		ref, _ := largemessage.DecodeReference(bRec.Value)
		for _, path := range []string{
			strings.Replace(ref.FullPayloadPath, "/"+topicB+"/", "/"+topicA+"/../"+topicB+"/", 1),
			strings.Replace(ref.FullPayloadPath, storeURL, storeURL+"/"+topicA+"/..", 1),
		} {
			v, err := largemessage.PayloadReferenceValue{FullPayloadPath: path, PayloadStoreClass: ref.PayloadStoreClass}.AppendTo(nil)
			if err != nil {
				t.Fatal(err)
			}
			err = bob.ProduceSync(ctx, &kgo.Record{Topic: topicA, Value: v, Headers: bRec.Headers}).FirstErr()
			if !errors.Is(err, kerr.InvalidRecord) {
				t.Fatalf("reference %q produced to A: %v, want INVALID_RECORD", path, err)
			}
		}
	})
	t.Run("a reference into B written to A directly is not resolved through the proxy", func(t *testing.T) {
		// Someone with broker access (not through the proxy) wrote it.
		if err := admin.ProduceSync(ctx, &kgo.Record{Topic: topicA, Value: bRec.Value, Headers: bRec.Headers}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		for fctx.Err() == nil {
			fs := bob.PollRecords(fctx, 10)
			for _, r := range fs.Records() {
				if bytes.Contains(r.Value, []byte("topic B's secret")) {
					t.Fatal("bob read B's payload through A")
				}
			}
			if fs.Err0() != nil && !errors.Is(fs.Err0(), context.DeadlineExceeded) {
				break
			}
		}
	})

	objects := func() int { return countFiles(t, storeDir) }
	t.Run("nothing intercepted before authentication", func(t *testing.T) {
		before := objects()
		big := randomBytes(9, 2<<20)
		produce := func(corr int32) []byte {
			req := kmsg.NewPtrProduceRequest()
			req.Version = 9
			req.Acks = 1
			req.TimeoutMillis = 10000
			rt := kmsg.NewProduceRequestTopic()
			rt.Topic = topicA
			rp := kmsg.NewProduceRequestTopicPartition()
			rp.Records = rawBatch(mustRecords(t, big), 0, 1)
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			return requestFrameOf(req, corr)
		}
		handshake := kmsg.NewPtrSASLHandshakeRequest()
		handshake.Version = 1
		handshake.Mechanism = "PLAIN"
		scramHandshake := kmsg.NewPtrSASLHandshakeRequest()
		scramHandshake.Version = 1
		scramHandshake.Mechanism = "SCRAM-SHA-256"
		scramFirst := kmsg.NewPtrSASLAuthenticateRequest()
		scramFirst.Version = 2
		scramFirst.SASLAuthBytes = []byte("n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL")
		auth := func(user, pass string) *kmsg.SASLAuthenticateRequest {
			a := kmsg.NewPtrSASLAuthenticateRequest()
			a.Version = 2
			a.SASLAuthBytes = []byte("\x00" + user + "\x00" + pass)
			return a
		}
		for _, tc := range []struct {
			name   string
			frames [][]byte
		}{
			{"no SASL at all", [][]byte{produce(1)}},
			{"a wrong password, pipelined", [][]byte{requestFrameOf(handshake, 1), requestFrameOf(auth("bob", "nope"), 2), produce(3)}},
			{"a handshake only", [][]byte{requestFrameOf(handshake, 1), produce(2)}},
			// The broker answers SCRAM's first step (the client-first
			// message) without error, before any password was proven.
			{"SCRAM's first step only", [][]byte{requestFrameOf(scramHandshake, 1), requestFrameOf(scramFirst, 2), produce(3)}},
		} {
			c := rawConn(t, s.Addr())
			var all []byte
			for _, f := range tc.frames {
				all = append(all, f...)
			}
			// The proxy may close the connection before the 2 MiB
			// Produce is all written (it decides on the request header,
			// before reading the body): a reset write is that end too.
			if _, err := c.Write(all); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatal(err)
			}
			// The connection ends (the broker's or the proxy's close)
			// without a Produce answer.
			for {
				msg, err := readRawFrame(c)
				if err != nil {
					break
				}
				if corr := int32(binary.BigEndian.Uint32(msg)); corr == int32(len(tc.frames)) {
					t.Fatalf("%s: the Produce request got an answer", tc.name)
				}
			}
			if n := objects(); n != before {
				t.Fatalf("%s: %d objects written for an unauthenticated connection", tc.name, n-before)
			}
		}
		// And authenticated, pipelined the same way, it is intercepted.
		c := rawConn(t, s.Addr())
		all := append(append(requestFrameOf(handshake, 1), requestFrameOf(auth("bob", "bob-secret"), 2)...), produce(3)...)
		if _, err := c.Write(all); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			msg, err := readRawFrame(c)
			if err != nil {
				t.Fatalf("authenticated pipeline: %v after %d answers", err, i)
			}
			if i == 2 {
				resp := kmsg.NewPtrProduceResponse()
				resp.Version = 9
				if err := resp.ReadFrom(msg[5:]); err != nil || resp.Topics[0].Partitions[0].ErrorCode != 0 {
					t.Fatalf("authenticated produce: %v %+v", err, resp)
				}
			}
		}
		if n := objects(); n != before+1 {
			t.Fatalf("authenticated produce of a 2 MiB record: %d new objects, want 1", n-before)
		}
	})
}

// requestFrameOf encodes req as a whole request frame (size, header v1 or
// v2 as req's version needs, body) with client id "raw".
func requestFrameOf(req kmsg.Request, corr int32) []byte {
	frame := make([]byte, 4, 64)
	frame = binary.BigEndian.AppendUint16(frame, uint16(req.Key()))
	frame = binary.BigEndian.AppendUint16(frame, uint16(req.GetVersion()))
	frame = binary.BigEndian.AppendUint32(frame, uint32(corr))
	frame = binary.BigEndian.AppendUint16(frame, 3)
	frame = append(frame, "raw"...)
	if req.IsFlexible() {
		frame = append(frame, 0)
	}
	frame = req.AppendTo(frame)
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	return frame
}
