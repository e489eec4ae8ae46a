package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ferry consume applies large.message.reference.resolve.topics: a record
// of topic t referencing an object of topic a is refused without it and
// resolved with it.
func TestConsumeResolveTopics(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	big, sum := randomFile(t, dir, "big", 2<<20, 25)
	if r := run(t, nil, "produce", "--brokers", brokers, "-t", "a", "--store", store, big); r.code != 0 {
		t.Fatalf("produce: exit %d", r.code)
	}
	// Copy the reference record, as is, from a to t.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics("a"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil || len(fs.Records()) != 1 {
		t.Fatalf("reading a: %v, %d records", err, len(fs.Records()))
	}
	ref := fs.Records()[0]
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Key: ref.Key, Value: ref.Value, Headers: ref.Headers}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	out := filepath.Join(dir, "out")
	r := run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--store", store, "--out", out, "-n", "1")
	if r.code != 1 {
		t.Errorf("without the property: exit %d, want 1", r.code)
	}
	r = run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--store", store, "--out", out, "-n", "1",
		"-X", "large.message.reference.resolve.topics=a")
	if r.code != 0 || fileSHA(t, filepath.Join(out, "big")) != sum {
		t.Fatalf("with large.message.reference.resolve.topics=a: exit %d", r.code)
	}
}

// consume --out names each file after the file produce sent it from
// (header ferry.file.name); standard input and records of other producers
// get TOPIC-PARTITION-OFFSET; a name seen before in the run gets the
// record's TOPIC-PARTITION-OFFSET- in front; a name that could leave the
// directory or hide in it is not used.
func TestConsumeOutNames(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(filepath.Join(dir, "v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	report, reportSum := randomFile(t, dir, "report.pdf", 2<<20, 30) // offloaded
	report2, report2Sum := randomFile(t, filepath.Join(dir, "v2"), "report.pdf", 100, 31)
	if r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "--store", store, report, report2); r.code != 0 {
		t.Fatalf("produce: exit %d", r.code)
	}
	if r := run(t, strings.NewReader("from stdin"), "produce", "--brokers", brokers, "-t", "t", "-"); r.code != 0 {
		t.Fatalf("produce -: exit %d", r.code)
	}
	// Names another producer might send.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad := []string{"../escape", "/etc/passwd", ".bashrc", "a/b", `a\b`, "..", "tab\there", strings.Repeat("x", 256), ""}
	for _, n := range bad {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(n), Headers: []kgo.RecordHeader{{Key: headerFileName, Value: []byte(n)}}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "out")
	total := 3 + len(bad)
	r := run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--store", store, "--out", out, "-n", strconv.Itoa(total))
	if r.code != 0 {
		t.Fatalf("consume: exit %d", r.code)
	}
	if fileSHA(t, filepath.Join(out, "report.pdf")) != reportSum || fileSHA(t, filepath.Join(out, "t-0-1-report.pdf")) != report2Sum {
		t.Error("report.pdf and its second version t-0-1-report.pdf differ from what was produced")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "t-0-2")); string(b) != "from stdin" {
		t.Errorf("standard input's record: %q", b)
	}
	for i, n := range bad {
		name := filepath.Join(out, fmt.Sprintf("t-0-%d", 3+i))
		if b, err := os.ReadFile(name); err != nil || string(b) != n {
			t.Errorf("record with file name %q: %s holds %q, %v", n, name, b, err)
		}
	}
	ents, _ := os.ReadDir(out)
	if len(ents) != total {
		t.Errorf("%d files in --out, want %d", len(ents), total)
	}
	if _, err := os.Stat(filepath.Join(dir, "escape")); err == nil {
		t.Error("a file was written outside --out")
	}
	if !strings.Contains(r.stdout, "t/0@1 100 bytes inline key=\"report.pdf\" -> "+filepath.Join(out, "t-0-1-report.pdf")+"\n") {
		t.Errorf("consume output %q", r.stdout)
	}
}

// A payload whose bytes were changed in the store (same size): ferry
// consume --out reads and writes all of it, then fails on the SHA-256 at its end with an
// error naming the record; no file is left in DIR, not even the temporary
// one. To standard output the bytes go out and the error follows.
func TestConsumeTamperedPayload(t *testing.T) {
	_, brokers := cluster(t)
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	big, _ := randomFile(t, dir, "big", 3<<20+5, 21)
	if r := run(t, nil, "produce", "--brokers", brokers, "-t", "t", "--store", storeDir, big); r.code != 0 {
		t.Fatalf("produce: exit %d: %s", r.code, r.stderr)
	}
	objs := storeObjects(t, storeDir)
	if len(objs) != 1 {
		t.Fatalf("store objects %v", objs)
	}
	obj := objs[0]
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1 // the last byte: the mismatch shows only at the end
	if err := os.Chmod(obj, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(obj, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	r := run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--store", storeDir, "--out", out, "-n", "1")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1: %s", r.code, r.stderr)
	}
	oneErrorLine(t, r, "topic t partition 0 offset 0")
	oneErrorLine(t, r, "SHA-256")
	if left, _ := os.ReadDir(out); len(left) != 0 {
		t.Errorf("files left in --out: %v", left)
	}
	r = run(t, nil, "consume", "--brokers", brokers, "-t", "t", "--store", storeDir, "-n", "1")
	if r.code != 1 {
		t.Fatalf("to standard output: exit %d, want 1: %s", r.code, r.stderr)
	}
	oneErrorLine(t, r, "SHA-256")
	if len(r.stdout) != len(b) {
		t.Errorf("to standard output: %d bytes written, want the payload's %d before the error", len(r.stdout), len(b))
	}
}
