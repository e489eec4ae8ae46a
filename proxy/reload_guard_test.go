package proxy

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferrykit/ferry/interceptor"
)

func spec(name, pattern string, kv ...string) interceptor.Spec {
	c := map[string]string{}
	if pattern != "" {
		c[interceptor.KeyTopicPattern] = pattern
	}
	for i := 0; i+1 < len(kv); i += 2 {
		c[kv[i]] = kv[i+1]
	}
	return interceptor.Spec{Name: name, Config: c}
}

// encryptSpec is the encrypt interceptor for topics matching pattern ("":
// all), under a fresh random base64key:// key.
func encryptSpec(pattern string) interceptor.Spec {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return spec("encrypt", pattern, interceptor.KeyEncryptKeyURL, "base64key://"+base64.URLEncoding.EncodeToString(key))
}

// What counts as removing or narrowing protection: conservative, a
// changed pattern is narrower unless it is the same or all topics.
func TestUnprotectedChanges(t *testing.T) {
	redact := spec("redact", "orders-.*", "redact.fields", "email")
	for _, tc := range []struct {
		name          string
		running, next []interceptor.Spec
		lost          string // "" none
	}{
		{"same", []interceptor.Spec{redact}, []interceptor.Spec{redact}, ""},
		{"widened to all topics", []interceptor.Spec{redact}, []interceptor.Spec{spec("redact", ".*", "redact.fields", "email")}, ""},
		{"pattern dropped (all topics)", []interceptor.Spec{redact}, []interceptor.Spec{spec("redact", "", "redact.fields", "email")}, ""},
		{"other settings changed", []interceptor.Spec{redact}, []interceptor.Spec{spec("redact", "orders-.*", "redact.fields", "phone")}, ""},
		{"added", []interceptor.Spec{redact}, []interceptor.Spec{redact, spec("encrypt", "")}, ""},
		{"non-protecting removed", []interceptor.Spec{redact, spec("large-message", "")}, []interceptor.Spec{redact}, ""},
		{"removed", []interceptor.Spec{redact, spec("large-message", "")}, []interceptor.Spec{spec("large-message", "")}, "redact (topic.pattern \"orders-.*\") would be removed"},
		{"emptied", []interceptor.Spec{spec("large-message", "")}, nil, "the interceptor chain would be empty"},
		{"narrowed", []interceptor.Spec{spec("encrypt", ".*")}, []interceptor.Spec{spec("encrypt", "orders-.*")}, "protect fewer topics"},
		{"a superset not provable", []interceptor.Spec{redact}, []interceptor.Spec{spec("redact", "orders-.*|payments", "redact.fields", "email")}, "protect fewer topics"},
		{"side changed", []interceptor.Spec{spec("encrypt", "", "side", "both")}, []interceptor.Spec{spec("encrypt", "", "side", "fetch")}, "another side"},
		{"validate-avro removed", []interceptor.Spec{spec("validate-avro", "x"), redact}, []interceptor.Spec{redact}, "validate-avro"},
		{"one of two redacts removed", []interceptor.Spec{redact, spec("redact", "users")}, []interceptor.Spec{redact}, `redact (topic.pattern "users")`},
	} {
		got := strings.Join(unprotectedChanges(tc.running, tc.next), "; ")
		if tc.lost == "" && got != "" || tc.lost != "" && !strings.Contains(got, tc.lost) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.lost)
		}
	}
}

// A reload that would remove or narrow redact, or empty the chain, is
// refused: the running chain stays, ERROR logged, counted; the same file
// with reload.allow.unprotected: true is applied. A file cut short after
// `interceptors:` (valid YAML, an empty list) keeps the running chain.
func TestReloadRefusesUnprotected(t *testing.T) {
	s := reloadServer(t, spec("redact", "orders-.*", "redact.fields", "email"))
	dir := t.TempDir()
	load := func(body string) Config {
		t.Helper()
		path := filepath.Join(dir, "proxy.yaml")
		if err := os.WriteFile(path, []byte("upstream: 127.0.0.1:1\nlisten: 127.0.0.1:0\n"+body), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfigFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	refused := 0
	for _, body := range []string{
		"interceptors:\n", // cut short
		"interceptors: []\n",
		"interceptors:\n  - name: reload-test\n",
		"interceptors:\n  - name: redact\n    config:\n      topic.pattern: orders-eu-.*\n      redact.fields: email\n",
	} {
		err := s.Reload(context.Background(), load(body))
		if !errors.Is(err, ErrReloadUnprotected) {
			t.Fatalf("reload to %q: %v, want ErrReloadUnprotected", body, err)
		}
		refused++
		if gen, _ := s.ChainGeneration(); gen != 1 {
			t.Fatalf("generation %d after a refused reload", gen)
		}
		g := s.acquireChain()
		if !g.active() || len(g.specs) != 1 || g.specs[0].Name != "redact" {
			t.Fatalf("the running chain was not kept: %+v", g.specs)
		}
		g.release()
	}
	if n := testutil.ToFloat64(s.rm.unprotected); n != float64(refused) {
		t.Fatalf("refused_unprotected_total %v, want %d", n, refused)
	}
	if _, failed := reloadCounts(s); failed != float64(refused) {
		t.Fatalf("failures %v, want %d", failed, refused)
	}
	// Widened to all topics: applied.
	if err := s.Reload(context.Background(), load("interceptors:\n  - name: redact\n    config:\n      topic.pattern: .*\n      redact.fields: email\n")); err != nil {
		t.Fatal(err)
	}
	// Said explicitly: applied, even to an empty chain.
	if err := s.Reload(context.Background(), load("reload.allow.unprotected: true\ninterceptors:\n")); err != nil {
		t.Fatal(err)
	}
	if g := s.acquireChain(); g.active() {
		t.Fatal("the chain is not empty after an allowed reload")
	}
}

// The start-up and reload lines name each interceptor with the topics it
// sees when that is not every topic.
func TestSpecNamesShowPattern(t *testing.T) {
	got := specNames([]interceptor.Spec{{Name: "validate-json"}, encryptSpec("secret-.*"), spec("redact", ".*", "redact.fields", "a")})
	want := []string{"validate-json", "encrypt(topic.pattern=secret-.*)", "redact"}
	if !slices.Equal(got, want) {
		t.Fatalf("specNames = %q, want %q", got, want)
	}
}
