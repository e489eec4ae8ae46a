package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/proxy"
)

// Records sealed by a proxy's encrypt interceptor, consumed straight from
// the cluster (a new user did so and took the ciphertext for data), are
// written as they are with one warning that names the header and the way
// to the plaintext; consumed through the proxy, they are plaintext and
// nothing is said.
func TestCLIConsumeSealedWarns(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	s, err := proxy.New(proxy.Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", Interceptors: []interceptor.Spec{{
		Name: "encrypt", Config: map[string]string{interceptor.KeyEncryptKeyURL: "base64key://" + base64.URLEncoding.EncodeToString(key), "topic.pattern": ".*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	values := []string{"first secret", "second secret"}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const warning = "a record sealed by a ferry proxy's encrypt interceptor (header " + interceptor.HeaderEncrypted + ")"
	consume := func(brokers string) (runResult, [][]byte) {
		out := filepath.Join(t.TempDir(), "out")
		r := run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--out", out, "-n", "2")
		if r.code != 0 {
			t.Fatalf("consume from %s: exit %d\n%s", brokers, r.code, r.stderr)
		}
		var got [][]byte
		for i := range 2 {
			b, err := os.ReadFile(filepath.Join(out, "t-0-"+string(rune('0'+i))))
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, b)
		}
		return r, got
	}
	r, got := consume(strings.Join(c.ListenAddrs(), ","))
	if n := strings.Count(r.stderr, warning); n != 1 {
		t.Fatalf("straight from the cluster: the warning %d times, want once:\n%s", n, r.stderr)
	}
	for i, b := range got {
		if !bytes.HasPrefix(b, []byte("FERRYENC")) || bytes.Contains(b, []byte(values[i])) {
			t.Fatalf("straight from the cluster, record %d is %q, want its sealed bytes", i, b)
		}
	}
	r, got = consume(s.Addr())
	if strings.Contains(r.stderr, warning) {
		t.Fatalf("through the proxy: warned of sealed records:\n%s", r.stderr)
	}
	for i, b := range got {
		if string(b) != values[i] {
			t.Fatalf("through the proxy, record %d is %q, want %q", i, b, values[i])
		}
	}
}
