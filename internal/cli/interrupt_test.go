package cli

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/internal/faultproxy"
)

// Child processes: the test binary runs Execute (signal handling included)
// when FERRY_CLI_CHILD holds the arguments, separated by \x1f.
const childEnv = "FERRY_CLI_CHILD"

func init() {
	if args, ok := os.LookupEnv(childEnv); ok {
		os.Args = append([]string{"ferry"}, strings.Split(args, "\x1f")...)
		os.Exit(Execute())
	}
}

// child is a ferry process.
type child struct {
	cmd    *exec.Cmd
	lines  chan string // standard output, line by line
	stderr lockedBuffer
	exited chan struct{}
	code   int
	took   time.Duration // from the signal to the exit
	sigAt  time.Time
}

func startFerry(t *testing.T, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0]), lines: make(chan string, 100), exited: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"))
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		err := c.cmd.Wait()
		c.code = c.cmd.ProcessState.ExitCode()
		if !c.sigAt.IsZero() {
			c.took = time.Since(c.sigAt)
		}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Errorf("ferry: %v", err)
		}
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			c.cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

// line waits for the next line on standard output.
func (c *child) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.exited
			t.Fatalf("ferry exited %d before printing a line; stderr %q", c.code, c.stderr.String())
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatalf("no line from ferry in 60s; stderr %q", c.stderr.String())
	}
	return ""
}

// signal sends sig and waits for the exit; ferry must stop within 5s.
func (c *child) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	select {
	case <-c.exited:
		t.Fatalf("ferry exited %d before the signal; stderr %q", c.code, c.stderr.String())
	default:
	}
	c.sigAt = time.Now()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("ferry did not stop within 20s of %v; stderr %q", sig, c.stderr.String())
	}
	t.Logf("ferry exited %d, %s after %v; stderr:\n%s", c.code, c.took.Round(time.Millisecond), sig, c.stderr.String())
	if c.took > 5*time.Second {
		t.Errorf("ferry took %s to stop after %v", c.took, sig)
	}
}

// silentListener accepts connections and never answers: a broker that
// hangs. The channel gets a value at each connection.
func silentListener(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	s, err := faultproxy.NewSilent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s.Addr(), s.Accepted()
}

// cluster is an in-process Kafka with a one-partition topic "t" whose
// answers the test controls.
func cluster(t *testing.T) (*kfake.Cluster, string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "1048588"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, strings.Join(c.ListenAddrs(), ",")
}

// stall leaves every request of key after the first answered ones
// unanswered, and reports on the channel when one is held.
func stall(c *kfake.Cluster, key kmsg.Key, answered int32) <-chan struct{} {
	held := make(chan struct{}, 1)
	var n atomic.Int32
	c.ControlKey(key.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if n.Add(1) <= answered {
			return nil, nil, false
		}
		select {
		case held <- struct{}{}:
		default:
		}
		return nil, nil, true // no answer
	})
	return held
}

// refuseProduce answers every Produce request after the first answered
// ones with code for each partition.
func refuseProduce(c *kfake.Cluster, answered int32, code int16) {
	var n atomic.Int32
	c.ControlKey(kmsg.Produce.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if n.Add(1) <= answered {
			return nil, nil, false
		}
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

func mustRandom(t *testing.T, n int) string {
	p, _ := randomFile(t, t.TempDir(), "random", n, 23)
	return p
}

// storeObjects lists the payload objects of topic t in a file store.
func storeObjects(t *testing.T, storeDir string) []string {
	t.Helper()
	objs, err := filepath.Glob(filepath.Join(storeDir, "t", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range objs {
		if !strings.HasPrefix(filepath.Base(o), ".") {
			out = append(out, o)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A broker that accepts connections and never answers: ferry produce and
// ferry consume stop on SIGINT (exit 130) and SIGTERM (exit 143) at once,
// saying so in one line.
func TestInterruptSilentBroker(t *testing.T) {
	addr, accepted := silentListener(t)
	dir := t.TempDir()
	f, _ := randomFile(t, dir, "f", 100, 13)
	for _, tc := range []struct {
		name string
		sig  os.Signal
		code int
		args []string
	}{
		{"produce SIGINT", os.Interrupt, 130, []string{"produce", "--brokers", addr, "-t", "t", f}},
		{"produce SIGTERM", syscall.SIGTERM, 143, []string{"produce", "--brokers", addr, "-t", "t", f}},
		{"consume SIGINT", os.Interrupt, 130, []string{"consume", "--brokers", addr, "-t", "t", "--timeout", "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startFerry(t, tc.args...)
			select { // connecting, signals handled
			case <-accepted:
			case <-time.After(60 * time.Second):
				t.Fatal("ferry did not connect")
			}
			time.Sleep(300 * time.Millisecond)
			c.signal(t, tc.sig)
			if c.code != tc.code {
				t.Errorf("exit %d, want %d", c.code, tc.code)
			}
			name := map[os.Signal]string{os.Interrupt: "SIGINT", syscall.SIGTERM: "SIGTERM"}[tc.sig]
			oneErrorLine(t, runResult{stderr: c.stderr.String()}, "connecting to Kafka at "+addr+": interrupted by "+name)
		})
	}
}

// stalledSecondProduce starts ferry produce of three files (100 bytes,
// 3 MiB, 100 bytes; contents from seed) to topic t of a cluster that
// answers the first Produce request and holds every later one unanswered,
// with extra flags, and returns once the first file is produced and the
// second's request is held: the process, the file store's directory and
// the three files.
func stalledSecondProduce(t *testing.T, seed uint64, extra ...string) (p *child, storeDir, small, big, third string) {
	t.Helper()
	c, brokers := cluster(t)
	held := stall(c, kmsg.Produce, 1)
	dir := t.TempDir()
	storeDir = filepath.Join(dir, "store")
	small, _ = randomFile(t, dir, "small", 100, seed)
	big, _ = randomFile(t, dir, "big", 3<<20, seed+1)
	third, _ = randomFile(t, dir, "third", 100, seed+2)

	args := append([]string{"produce", "--brokers", brokers, "-t", "t", "--store", storeDir}, extra...)
	p = startFerry(t, append(args, small, big, third)...)
	if l := p.line(t); l != "t/0@0 100 bytes inline" {
		t.Fatalf("first line %q", l)
	}
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatalf("the second Produce request never came; stderr %q", p.stderr.String())
	}
	return p, storeDir, small, big, third
}

// The broker answers the first Produce request, then none: SIGINT stops
// ferry produce while the second file's reference is unanswered. The
// summary names the produced file and its offset, and keeps the payload
// of the record whose request went out (it may be in the topic).
func TestInterruptUnansweredProduce(t *testing.T) {
	p, storeDir, small, big, third := stalledSecondProduce(t, 14)
	p.signal(t, os.Interrupt)
	if p.code != 130 {
		t.Errorf("exit %d, want 130", p.code)
	}
	objs := storeObjects(t, storeDir)
	if len(objs) != 1 {
		t.Fatalf("store objects %v, want big's payload", objs)
	}
	r := runResult{stderr: p.stderr.String()}
	oneErrorLine(t, r, "ferry: interrupted by SIGINT while producing "+big+"; its payload file://"+filepath.ToSlash(objs[0])+
		" was kept: the produce request was sent but not answered, so the record may be in the topic")
	oneErrorLine(t, r, "; produced 1 of 3 inputs: "+small+" t/0@0; not produced: "+big+", "+third)
}

// The producer id is never granted, so the record waits in the client and
// is never sent: SIGINT stops ferry produce and the payload published for
// the record is deleted, on the streaming path (a file over the threshold)
// and the in-memory one (with compression, where exact sizing decides).
func TestInterruptBeforeSend(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"streamed", nil},
		{"in memory", []string{"-X", "compression.type=zstd", "-X", "large.message.threshold.bytes=100000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, brokers := cluster(t)
			held := stall(c, kmsg.InitProducerID, 0)
			dir := t.TempDir()
			storeDir := filepath.Join(dir, "store")
			big, _ := randomFile(t, dir, "big", 2<<20, 17)

			p := startFerry(t, append(append([]string{"produce", "--brokers", brokers, "-t", "t", "--store", storeDir}, tc.extra...), big)...)
			select {
			case <-held:
			case <-time.After(60 * time.Second):
				t.Fatalf("no InitProducerID request; stderr %q", p.stderr.String())
			}
			var path string
			waitFor(t, "the payload", func() bool {
				objs := storeObjects(t, storeDir)
				if len(objs) == 1 {
					path = "file://" + filepath.ToSlash(objs[0])
				}
				return path != ""
			})
			p.signal(t, os.Interrupt)
			if p.code != 130 {
				t.Errorf("exit %d, want 130", p.code)
			}
			oneErrorLine(t, runResult{stderr: p.stderr.String()},
				"ferry: interrupted by SIGINT while producing "+big+"; its payload "+path+" was deleted; nothing was produced")
			if objs := storeObjects(t, storeDir); len(objs) != 0 {
				t.Errorf("store objects left: %v", objs)
			}
		})
	}
}

// ferry consume waiting for records (--timeout 0) stops on SIGINT and says
// how many records it wrote.
func TestInterruptConsume(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	f, _ := randomFile(t, dir, "f", 100, 18)
	if r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", f); r.code != 0 {
		t.Fatalf("produce: exit %d", r.code)
	}
	p := startFerry(t, "consume", "--brokers", brokers, "-t", "t", "--timeout", "0", "--out", filepath.Join(dir, "out"))
	if l := p.line(t); !strings.HasPrefix(l, "t/0@0 100 bytes inline") {
		t.Fatalf("line %q", l)
	}
	p.signal(t, os.Interrupt)
	if p.code != 130 {
		t.Errorf("exit %d, want 130", p.code)
	}
	oneErrorLine(t, runResult{stderr: p.stderr.String()}, "ferry: interrupted by SIGINT after 1 record (the last t/0@0)")
}

// A produce the broker refuses after the payload was published: the
// payload is deleted and the error says so; an offloaded key, named by its
// content (it may be shared), stays. The streaming and in-memory paths.
func TestFailedProduceDeletesPayload(t *testing.T) {
	// A key that does not compress much: offloaded above the threshold.
	longKey := base64.RawURLEncoding.EncodeToString(mustRead(t, mustRandom(t, 4500)))
	for _, tc := range []struct {
		name    string
		size    int
		extra   []string
		keyKept bool
	}{
		{"streamed", 2 << 20, nil, false},
		{"in memory, key offloaded too", 500 << 10, []string{"-X", "compression.type=zstd",
			"-X", "large.message.threshold.bytes=2000", "--key", longKey}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, brokers := cluster(t)
			refuseProduce(c, 0, kerr.InvalidRecord.Code)
			dir := t.TempDir()
			storeDir := filepath.Join(dir, "store")
			big, _ := randomFile(t, dir, "big", tc.size, 19)
			r := run(t, nil, append(append([]string{"produce", "--brokers", brokers, "-t", "t", "--store", storeDir}, tc.extra...), big)...)
			if r.code != 1 {
				t.Errorf("exit %d, want 1", r.code)
			}
			oneErrorLine(t, r, kerr.InvalidRecord.Message)
			oneErrorLine(t, r, "ferry: "+big+": ")
			oneErrorLine(t, r, " was deleted")
			objs := storeObjects(t, storeDir)
			if !tc.keyKept {
				if len(objs) != 0 {
					t.Errorf("store objects left: %v", objs)
				}
				return
			}
			if len(objs) != 1 || len(filepath.Base(objs[0])) != 64 {
				t.Fatalf("store objects %v, want the key's (a content id)", objs)
			}
			oneErrorLine(t, r, "; its key's payload file://"+filepath.ToSlash(objs[0])+" was kept: it is named by its content and may be shared with other records")
		})
	}
}

// A failure part-way through several files names what was produced and
// what was not.
func TestFailedProduceSummary(t *testing.T) {
	c, brokers := cluster(t)
	refuseProduce(c, 1, kerr.InvalidRecord.Code)
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	a, _ := randomFile(t, dir, "a", 100, 20)
	big, _ := randomFile(t, dir, "big", 2<<20, 21)
	b, _ := randomFile(t, dir, "b", 100, 22)
	r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "--store", storeDir, a, big, b)
	if r.code != 1 || r.stdout != "t/0@0 100 bytes inline\n" {
		t.Fatalf("exit %d, stdout %q", r.code, r.stdout)
	}
	oneErrorLine(t, r, "ferry: "+big+": producing the reference: "+kerr.InvalidRecord.Message)
	oneErrorLine(t, r, " was deleted; produced 1 of 3 inputs: "+a+" t/0@0; not produced: "+big+", "+b)
	if objs := storeObjects(t, storeDir); len(objs) != 0 {
		t.Errorf("store objects left: %v", objs)
	}
}

// SIGINT while a large file is being hashed (before its upload) stops ferry
// produce at once: the hash reads stop with the context.
func TestInterruptWhileHashing(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(16 << 30); err != nil { // sparse: no disk used, long to hash
		t.Fatal(err)
	}
	f.Close()
	p := startFerry(t, "produce", "--brokers", brokers, "-t", "t", "--store", filepath.Join(dir, "store"), big)
	waitFor(t, "the store's directory", func() bool { _, err := os.Stat(filepath.Join(dir, "store")); return err == nil })
	time.Sleep(500 * time.Millisecond) // hashing
	p.signal(t, os.Interrupt)
	if p.code != 130 {
		t.Errorf("exit %d, want 130", p.code)
	}
	oneErrorLine(t, runResult{stderr: p.stderr.String()}, "ferry: interrupted by SIGINT while producing "+big+"; nothing was produced")
}

func TestProduceStoppedMessage(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(&Interrupted{Signal: os.Interrupt})
	done := []sent{{Name: "a", Topic: "t", Partition: 0, Offset: 5}}
	err := produceStopped(ctx, []string{"a", "b", "-"}, done, nil)
	if want := "interrupted by SIGINT before producing b; produced 1 of 3 inputs: a t/0@5; not produced: b, standard input"; err.Error() != want {
		t.Errorf("got  %q\nwant %q", err, want)
	}
	var intr *Interrupted
	if !errors.As(err, &intr) || intr.ExitCode() != 130 {
		t.Errorf("the cause is not in the chain: %v", err)
	}
	var inputs []string
	for i := range 13 {
		inputs = append(inputs, fmt.Sprint("f", i))
	}
	err = produceStopped(context.Background(), inputs, nil, &sendError{name: "f0", err: errors.New("boom"), notes: []string{"its payload x was deleted"}})
	if want := "f0: boom; its payload x was deleted; nothing was produced"; err.Error() != want {
		t.Errorf("got  %q\nwant %q", err, want)
	}
	if got, want := listSome(inputs), "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9 and 3 more"; got != want {
		t.Errorf("listSome = %q, want %q", got, want)
	}
}

// SIGTERM while ferry proxy starts and its interceptor's store accepts
// connections but never answers (a helper saw the proxy hang there past
// SIGTERM): it exits 143 at once, not when the store's check times out.
func TestProxyStartupSIGTERM(t *testing.T) {
	store, accepted := silentListener(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	p := startFerry(t, "proxy", "--upstream", newCluster(t), "--listen", "127.0.0.1:0", "--interceptors", "large-message",
		"--store", "s3://bucket/p?region=us-east-1&use_path_style=true&endpoint=http://"+store)
	select {
	case <-accepted: // the store's check is under way
	case <-time.After(30 * time.Second):
		t.Fatalf("the proxy never reached the store; stderr %q", p.stderr.String())
	}
	p.signal(t, syscall.SIGTERM)
	if p.code != 143 {
		t.Errorf("exit %d, want 143", p.code)
	}
	oneErrorLine(t, runResult{stderr: p.stderr.String()}, "ferry: interrupted by SIGTERM while the proxy started (opening its interceptors: a payload store, KMS or schema registry that does not answer)")
}
