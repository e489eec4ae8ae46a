package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// "ferry proxy" with a YAML config in front of an in-process Kafka (kfake;
// the real-broker tests are in integration/): a client produces and
// consumes through it, and cancelling the context (SIGTERM) exits 0.
func TestProxyCommand(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	yaml := "upstream:\n  - " + c.ListenAddrs()[0] + "\nlisten: 127.0.0.1:0\nadmin.listen: 127.0.0.1:0\n" +
		"socket.request.max.bytes: 1048576\nshutdown:\n  timeout.ms: 5000\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- RunIO(ctx, []string{"proxy", "--config", cfg}, strings.NewReader(""), &stdout, &stderr)
	}()

	re := regexp.MustCompile(`bootstrap (\S+) `)
	var bootstrap string
	for deadline := time.Now().Add(30 * time.Second); bootstrap == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := re.FindStringSubmatch(stdout.String()); m != nil {
			bootstrap = m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("ferry proxy exited %d early; stderr:\n%s", code, stderr.String())
		default:
		}
	}
	if bootstrap == "" {
		t.Fatalf("no bootstrap line; stdout %q stderr %q", stdout.String(), stderr.String())
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.DefaultProduceTopic("t"), kgo.ConsumeTopics("t"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	if err := cl.ProduceSync(pctx, &kgo.Record{Value: []byte("through the proxy")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var got []*kgo.Record
	for len(got) == 0 && pctx.Err() == nil {
		got = append(got, cl.PollFetches(pctx).Records()...)
	}
	if len(got) != 1 || string(got[0].Value) != "through the proxy" {
		t.Fatalf("consumed %v", got)
	}
	cl.Close()

	cancel()
	select {
	case code := <-done:
		if code != ExitOK {
			t.Fatalf("exit %d after SIGTERM; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ferry proxy did not stop within 20s of SIGTERM")
	}
	if !strings.Contains(stderr.String(), "proxy shutting down") || !strings.Contains(stderr.String(), "proxy stopped") {
		t.Fatalf("no shutdown or stop log line; stderr:\n%s", stderr.String())
	}
}

func TestProxyCommandBadConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("upstream: 127.0.0.1:9092\nlisten: 127.0.0.1:0\nlisten.port: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"proxy"}, // no upstream
		{"proxy", "--upstream", "no-port"},
		{"proxy", "--config", filepath.Join(dir, "missing.yaml")},
		{"proxy", "--config", bad}, // unknown key
		// Found by review: a port layout that cannot work fails at start.
		{"proxy", "--upstream", newCluster(t), "--listen", "127.0.0.1:65535"},
		{"proxy", "--upstream", newCluster(t), "--listen", "127.0.0.1:0", "--interceptors", "no-such-interceptor"},
		{"proxy", "--upstream", "127.0.0.1:9092", "--store", "file:///tmp/x"}, // --store without large-message
		{"proxy", "--upstream", "127.0.0.1:9092", "--metrics-max-topics", "-1"},
		// an OTLP endpoint that is not a URL is refused before serving
		{"proxy", "--upstream", newCluster(t), "--listen", "127.0.0.1:0", "--interceptors", "large-message",
			"--store", "file://" + dir, "--tracing", "--tracing-endpoint", "collector:4318"},
	} {
		r := run(t, nil, args...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, "ferry: ") {
			t.Errorf("ferry %v: exit %d, stderr %q; want exit 2 with a ferry: line", args, r.code, r.stderr)
		}
	}
	// Found by a new-user helper: large-message without a store named the
	// key but not the flag.
	r := run(t, nil, "proxy", "--upstream", newCluster(t), "--listen", "127.0.0.1:0", "--interceptors", "large-message")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "large.message.payload.store.url is not set") || !strings.Contains(r.stderr, "--store URL") {
		t.Errorf("proxy --interceptors large-message without a store: exit %d, stderr %q; want exit 2 naming --store", r.code, r.stderr)
	}
}

// The proxy's log level defaults to info and its --help says so; the other
// commands' default is warn and the root's --help says that. Given before
// or after "proxy", --log-level warn silences the INFO lines.
func TestProxyLogLevel(t *testing.T) {
	if r := run(t, nil, "proxy", "--help"); !regexp.MustCompile(`--log-level string +log level on stderr: debug, info, warn or error \(default "info"\)`).MatchString(r.stdout) {
		t.Errorf("proxy --help does not give info as the default log level:\n%s", r.stdout)
	}
	if r := run(t, nil, "--help"); !strings.Contains(r.stdout, `(default "warn")`) {
		t.Errorf("--help does not give warn as the default log level:\n%s", r.stdout)
	}
	upstream := newCluster(t)
	for _, c := range []struct {
		args     []string
		wantInfo bool
	}{
		{[]string{"proxy", "--upstream", upstream, "--listen", "127.0.0.1:0"}, true},
		{[]string{"proxy", "--log-level", "warn", "--upstream", upstream, "--listen", "127.0.0.1:0"}, false},
		{[]string{"--log-level", "warn", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0"}, false},
		{[]string{"proxy", "--upstream", upstream, "--listen", "127.0.0.1:0", "--interceptors", "validate-json"}, true},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr lockedBuffer
		done := make(chan int, 1)
		go func() { done <- RunIO(ctx, c.args, strings.NewReader(""), &stdout, &stderr) }()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stdout.String(), "bootstrap") && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if code := <-done; code != ExitOK {
			t.Fatalf("%v: exit %d; stderr:\n%s", c.args, code, stderr.String())
		}
		if got := strings.Contains(stderr.String(), `level=INFO msg="proxy listening"`); got != c.wantInfo {
			t.Errorf("%v: INFO lines logged %v, want %v; stderr:\n%s", c.args, got, c.wantInfo, stderr.String())
		}
		// The start-up line names the interceptors in chain order.
		want := "interceptors=[]"
		if slices.Contains(c.args, "--interceptors") {
			want = "interceptors=[validate-json]"
		}
		if c.wantInfo && !strings.Contains(stderr.String(), want) {
			t.Errorf("%v: the start-up line does not say %s; stderr:\n%s", c.args, want, stderr.String())
		}
	}
}

// A misspelled --interceptors name is a usage error suggesting the
// built-in it is near; a name near none keeps the registry's error.
func TestProxyInterceptorNameTypo(t *testing.T) {
	r := run(t, nil, "proxy", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--interceptors", "large-mesage")
	if r.code != 2 {
		t.Fatalf("exit %d, want 2", r.code)
	}
	oneErrorLine(t, r, `"large-mesage" is not an interceptor (did you mean large-message?)`)
	r = run(t, nil, "proxy", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--interceptors", "zzzzzzzzzzzz")
	if r.code == 0 || !strings.Contains(r.stderr, "is not registered") {
		t.Fatalf("an unknown name: exit %d", r.code)
	}
}
