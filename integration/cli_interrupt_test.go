package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

// ferryProc is a running ferry command.
type ferryProc struct {
	cmd    *exec.Cmd
	lines  chan string // standard output, line by line
	mu     sync.Mutex
	stdout []string
	stderr strings.Builder
	exited chan struct{}
	code   int
}

func startFerryProc(t *testing.T, bin string, args ...string) *ferryProc {
	t.Helper()
	p := &ferryProc{cmd: exec.Command(bin, args...), lines: make(chan string, 1000), exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	errDone := make(chan struct{})
	go func() {
		b, _ := io.ReadAll(stderr)
		p.mu.Lock()
		p.stderr.Write(b)
		p.mu.Unlock()
		close(errDone)
	}()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.stdout = append(p.stdout, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		<-errDone
		p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// interrupt sends sig and returns how long ferry took to exit; it fails
// the test after 20s.
func (p *ferryProc) interrupt(t *testing.T, sig os.Signal) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("ferry did not exit within 20s of %v", sig)
	}
	took := time.Since(start)
	t.Logf("ferry exited %d %s after %v\nstdout:\n%s\nstderr:\n%s", p.code, took.Round(time.Millisecond), sig,
		strings.Join(p.stdout, "\n"), p.stderr.String())
	return took
}

// errorLine checks that stderr is one "ferry: " line and returns it.
func (p *ferryProc) errorLine(t *testing.T) string {
	t.Helper()
	s := strings.TrimRight(p.stderr.String(), "\n")
	if strings.Contains(s, "\n") || !strings.HasPrefix(s, "ferry: ") {
		t.Errorf("stderr %q: want one line starting with \"ferry: \"", s)
	}
	return s
}

// A broker address that accepts connections and never answers: ferry
// produce and ferry consume, real processes, stop promptly on SIGINT
// (exit 130) and SIGTERM (exit 143).
func TestCLIInterruptUnansweringBroker(t *testing.T) {
	bin := buildFerry(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 100)
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	dir := t.TempDir()
	f := filepath.Join(dir, "small")
	if err := os.WriteFile(f, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	for _, tc := range []struct {
		name string
		sig  os.Signal
		code int
		args []string
	}{
		{"produce SIGINT", os.Interrupt, 130, []string{"produce", "--brokers", addr, "--topic", "t", "--store", filepath.Join(dir, "store"), f}},
		{"consume SIGTERM", syscall.SIGTERM, 143, []string{"consume", "--brokers", addr, "--topic", "t", "--timeout", "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startFerryProc(t, bin, tc.args...)
			select { // connecting, signals handled
			case <-accepted:
			case <-time.After(time.Minute):
				t.Fatal("ferry did not connect")
			}
			time.Sleep(300 * time.Millisecond)
			took := p.interrupt(t, tc.sig)
			if p.code != tc.code {
				t.Errorf("exit %d, want %d", p.code, tc.code)
			}
			if took > 5*time.Second {
				t.Errorf("took %s to stop", took)
			}
			if l := p.errorLine(t); !strings.Contains(l, "connecting to Kafka at "+addr+": interrupted by SIG") {
				t.Errorf("stderr %q", l)
			}
		})
	}
}

// ferry produce of several large files to the real broker and S3 server,
// interrupted with SIGINT after the first file: it exits 130 within
// seconds and says which files were produced at which offsets. The topic
// holds exactly those records, the bucket exactly their payloads (plus the
// interrupted record's when its request was already sent, as stderr then
// says), and no multipart upload is left.
func TestCLIInterruptMidway(t *testing.T) {
	b := brokers(t)
	bin := buildFerry(t)
	storeURL := storetest.S3URL(t, "ferry-integration")
	topic := newTopic(t, nil)
	dir := t.TempDir()
	var files []string
	for i := range 6 {
		p := filepath.Join(dir, fmt.Sprintf("part-%d.bin", i))
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(f, rand.NewChaCha8([32]byte{byte(i), 42}), 12<<20); err != nil {
			t.Fatal(err)
		}
		f.Close()
		files = append(files, p)
	}
	p := startFerryProc(t, bin, append([]string{"produce", "--brokers", b, "--topic", topic, "--store", storeURL}, files...)...)
	select {
	case <-p.lines:
	case <-p.exited:
		t.Fatalf("ferry exited %d before producing a file: %s", p.code, p.stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatal("no file produced within 2 minutes")
	}
	took := p.interrupt(t, os.Interrupt)
	if took > 5*time.Second {
		t.Errorf("took %s to stop", took)
	}
	if p.code != 130 {
		t.Fatalf("exit %d, want 130", p.code)
	}
	n := len(p.stdout)
	if n == len(files) {
		t.Skip("every file was produced before the signal arrived")
	}
	line := p.errorLine(t)
	var produced []string
	for i, l := range p.stdout {
		produced = append(produced, fmt.Sprintf("%s %s/0@%d", files[i], topic, i))
		if f := strings.Fields(l); len(f) != 5 || f[0] != fmt.Sprintf("%s/0@%d", topic, i) || f[3] != "offloaded" {
			t.Errorf("output line %q", l)
		}
	}
	// The signal comes while the next file is produced, or just before.
	if !strings.HasPrefix(line, "ferry: interrupted by SIGINT while producing "+files[n]) &&
		!strings.HasPrefix(line, "ferry: interrupted by SIGINT before producing "+files[n]+";") {
		t.Errorf("stderr does not say that %s was being produced", files[n])
	}
	for _, want := range []string{
		fmt.Sprintf("; produced %d of %d inputs: %s; not produced: %s", n, len(files), strings.Join(produced, ", "), strings.Join(files[n:], ", ")),
	} {
		if !strings.Contains(line, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}

	if got := endOffset(t, topic); got != int64(n) {
		t.Errorf("topic holds %d records, want %d", got, n)
	}
	direct, err := payloadstore.Open(context.Background(), storeURL, payloadstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	want := map[string]bool{}
	for _, l := range p.stdout {
		f := strings.Fields(l)
		want[f[len(f)-1]] = true
	}
	kept := strings.Contains(line, " was kept: the produce request was sent but not answered")
	objs := objectsUnder(t, direct, topic)
	extra := 0
	for _, o := range objs {
		if !want[o] {
			extra++
			if !kept || !strings.Contains(line, "its payload "+o+" was kept") {
				t.Errorf("object %s is neither a produced record's payload nor named as kept", o)
			}
		}
	}
	if len(objs)-extra != len(want) {
		t.Errorf("store holds %d of the %d produced payloads", len(objs)-extra, len(want))
	}
	u, _ := url.Parse(storeURL)
	prefix := strings.Trim(u.Path, "/") + "/"
	// payloadstore aborts an interrupted multipart upload in the background.
	left := -1
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := storetest.S3Client(t).ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String(u.Host), Prefix: aws.String(prefix)})
		if err != nil {
			t.Fatal(err)
		}
		if left = len(out.Uploads); left == 0 {
			break
		}
	}
	if left != 0 {
		t.Errorf("%d multipart uploads left under %s", left, prefix)
	}
}

// A topic whose max.message.bytes is too small even for a reference: ferry
// produce refuses each input with one line naming the topic and the
// limit, produces nothing and leaves nothing in the S3 bucket, both on the
// streaming path (a large file: uploaded, then deleted) and in memory
// (standard input, no key: its value is published and deleted today; the
// library's Serializer is to refuse it before publishing).
func TestCLIRefusedRecordLeavesNoObject(t *testing.T) {
	b := brokers(t)
	bin := buildFerry(t)
	storeURL := storetest.S3URL(t, "ferry-integration")
	tiny := "200"
	topic := newTopic(t, map[string]*string{"max.message.bytes": &tiny})
	dir := t.TempDir()
	big := filepath.Join(dir, "big.bin")
	if err := os.WriteFile(big, randomBytes(5, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, input, want string
		extra             []string
		stdin             []byte
	}{
		{"streamed", big, "ferry: " + big + ": the record cannot fit topic " + topic + " even with its value offloaded: the limit is 139 bytes, from the topic's max.message.bytes (200 bytes)", nil, nil},
		// With compression, exact sizing decides in memory.
		{"in memory", "-", "ferry: standard input: the record cannot fit topic " + topic + " even with its key and value offloaded: the limit is 139 bytes",
			[]string{"-X", "compression.type=zstd"}, randomBytes(6, 1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"produce", "--brokers", b, "--topic", topic, "--store", storeURL}, tc.extra...)
			cmd := exec.Command(bin, append(args, tc.input)...)
			cmd.Stdin = strings.NewReader(string(tc.stdin))
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			t.Logf("exit %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			if cmd.ProcessState.ExitCode() != 1 || stdout.Len() != 0 {
				t.Errorf("exit %d, stdout %q: want 1, nothing produced", cmd.ProcessState.ExitCode(), stdout.String())
			}
			line := strings.TrimRight(stderr.String(), "\n")
			if strings.Contains(line, "\n") || !strings.HasPrefix(line, tc.want) {
				t.Errorf("stderr %q: want one line starting %q", line, tc.want)
			}
			direct, err := payloadstore.Open(context.Background(), storeURL, payloadstore.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer direct.Close()
			if objs := objectsUnder(t, direct, topic); len(objs) != 0 {
				t.Errorf("objects left in the store: %v", objs)
			}
		})
	}
	if got := endOffset(t, topic); got != 0 {
		t.Errorf("topic holds %d records", got)
	}
}
