package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/ferrykit/ferry/lifecycle"
	"github.com/ferrykit/ferry/payloadstore"
)

// Bad --mode and --settle values are usage errors (exit 2), before any
// connection.
func TestGCUsage(t *testing.T) {
	for _, args := range [][]string{
		{"gc", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", "file:///tmp", "--mode", "sometimes"},
		{"gc", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", "file:///tmp", "--settle", "-1s"},
		{"gc", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", "file:///tmp", "--grace", "-1s"},
	} {
		if r := run(t, nil, args...); r.code != ExitUsage {
			t.Errorf("%v: exit %d, want %d", args, r.code, ExitUsage)
		}
	}
}

// ferry gc on an in-process Kafka: a full-read run quarantines and deletes
// the orphan and keeps the produced file's payload; a checkpoint-mode run
// says no checkpoint is usable yet and deletes nothing.
func TestGCOutput(t *testing.T) {
	brokers := newCluster(t)
	dir := t.TempDir()
	store := "file://" + dir
	big, _ := randomFile(t, t.TempDir(), "big.bin", 2<<20, 1)
	if r := run(t, nil, "produce", "--brokers", brokers, "--topic", "t", "--store", store, big); r.code != ExitOK {
		t.Fatalf("produce: exit %d", r.code)
	}
	fs, err := payloadstore.NewFileStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := payloadstore.PublishBytes(context.Background(), fs, "t", []byte("orphan"))
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "gc", "--brokers", brokers, "--topic", "t", "--store", store, "--grace", "0s", "--settle", "0s")
	if r.code != ExitOK {
		t.Fatalf("gc: exit %d", r.code)
	}
	// Without a terminal (no progress bar) the settle wait is logged: with
	// the default 10m, nothing else is written for as long.
	if !strings.Contains(r.stderr, "gc: 1 objects quarantined; waiting --settle 0s before rechecking") {
		t.Errorf("stderr lacks the settle wait: %s", r.stderr)
	}
	for _, want := range []string{
		"deleted " + orphan.FullPayloadPath + " (6 bytes)\n",
		"topic t (cleanup.policy=delete): mode full, 1 records read, 1 live references, 0 appended records rechecked\n",
		"objects: 2 listed, 1 kept referenced, 0 kept newer than 0s (not checked), 1 quarantined, 0 restored, 1 deleted, 6 bytes freed\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	r = run(t, nil, "gc", "--brokers", brokers, "--topic", "t", "--store", store, "--grace", "0s", "--settle", "0s", "--mode", "checkpoint")
	if r.code != ExitOK || !strings.Contains(r.stdout, "mode checkpoint, no checkpoint passed by retention yet") ||
		!strings.Contains(r.stdout, "1 kept not provably garbage, 0 quarantined, 0 restored, 0 deleted") {
		t.Fatalf("checkpoint mode: exit %d", r.code)
	}
}

// A run stopped during the settle wait says where its quarantined objects
// stay and that the next run finishes them; the next run lists each object
// it deletes of them, with the bytes freed apart from its own.
func TestGCSummaryInterruptedAndLeftovers(t *testing.T) {
	var out bytes.Buffer
	a := &app{stdout: &out}
	a.gcSummary(gcFlags{topic: "t"}, lifecycle.Summary{RunID: "r1", Listed: 2, Quarantined: 2})
	if want := "quarantine: 2 objects of this run stay in t/.ferry-gc/q/r1/ (the run did not finish); the next ferry gc of the topic restores those a record references and deletes the rest\n"; !strings.Contains(out.String(), want) {
		t.Errorf("interrupted run's output:\n%s\nlacks %q", out.String(), want)
	}
	out.Reset()
	a.gcSummary(gcFlags{topic: "t"}, lifecycle.Summary{RunID: "r2", LeftoverRuns: 1, LeftoverDeleted: 1, LeftoverBytesFreed: 7,
		LeftoverDeletedObjects: []payloadstore.ObjectInfo{{FullPath: "file:///s/t/0a/x", Size: 7}}})
	for _, want := range []string{
		"deleted file:///s/t/0a/x (7 bytes): left in quarantine by an interrupted run\n",
		", 0 deleted, 0 bytes freed\n",
		"quarantine: 1 folders of interrupted runs finished, 0 objects restored, 1 deleted, 7 bytes freed\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("next run's output:\n%s\nlacks %q", out.String(), want)
		}
	}
	if strings.Contains(out.String(), "stay in") {
		t.Errorf("a finished run says objects stay in quarantine:\n%s", out.String())
	}
}
