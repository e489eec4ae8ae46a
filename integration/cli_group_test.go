package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/cli"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/largemessage"
)

// groupLine is one line ferry consume --out prints: the record's
// TOPIC/PARTITION@OFFSET and the file written.
type groupLine struct{ at, file string }

func parseConsumeLines(t *testing.T, out string) []groupLine {
	t.Helper()
	var ls []groupLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		at, _, ok1 := strings.Cut(l, " ")
		_, file, ok2 := strings.Cut(l, " -> ")
		if !ok1 || !ok2 {
			t.Fatalf("consume output line %q", l)
		}
		ls = append(ls, groupLine{at, file})
	}
	return ls
}

// runCLI runs ferry in-process and returns its exit code, stdout, stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(ctxT(t, 5*time.Minute), args, &out, &errb)
	return code, out.String(), errb.String()
}

// committedMatchesEnd fails unless group's committed offset on every
// partition of topic is the partition's end offset (nothing read twice or
// left behind by the next run).
func committedMatchesEnd(t *testing.T, group, topic string) {
	t.Helper()
	adm := kadm.NewClient(client(t))
	ctx := ctxT(t, 30*time.Second)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(lo kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, lo.Partition)
		if lo.Offset == 0 && !ok {
			return
		}
		if !ok || c.At != lo.Offset {
			t.Errorf("group %s partition %d: committed %d (found %v), end offset %d", group, lo.Partition, c.At, ok, lo.Offset)
		}
	})
}

// ferry consume --group G -n 5, then --group G -n 7 write the 12 records of
// a three-partition topic (some offloaded to S3) exactly once between them;
// the group's committed offsets are then the end offsets, a third run with
// --timeout reads nothing, and a fourth (-X group.id=G) reads only the
// record produced after.
func TestCLIConsumeGroupResumes(t *testing.T) {
	b := brokers(t)
	store := storetest.S3URL(t, "ferry-integration")
	topic := newTopicPartitions(t, 3, nil)
	group := "ferry-it-group-" + topic
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{} // base name -> bytes
	var files []string
	for i := range 12 {
		size := 100 + i
		if i%3 == 0 {
			size = 200<<10 + i // over the 64 KiB threshold below: offloaded
		}
		data := make([]byte, size)
		rand.NewChaCha8([32]byte{byte(i), 21}).Read(data)
		name := fmt.Sprintf("f%02d.bin", i)
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		want[name] = data
		files = append(files, p)
	}
	threshold := "-X" + largemessage.KeyThreshold + "=65536"
	code, out, errs := runCLI(t, append([]string{"produce", "--brokers", b, "--topic", topic, "--store", store, threshold}, files...)...)
	if code != 0 {
		t.Fatalf("produce exited %d: %s", code, errs)
	}
	if n := strings.Count(out, "offloaded"); n != 4 {
		t.Fatalf("produce offloaded %d records, want 4:\n%s", n, out)
	}

	consume := func(outDir string, extra ...string) []groupLine {
		t.Helper()
		args := append([]string{"consume", "--brokers", b, "--topic", topic, "--store", store, "--out", outDir}, extra...)
		code, out, errs := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("consume %v exited %d: %s", extra, code, errs)
		}
		return parseConsumeLines(t, out)
	}
	first := consume(filepath.Join(dir, "out1"), "--group", group, "-n", "5", "--timeout", "2m")
	second := consume(filepath.Join(dir, "out2"), "--group", group, "-n", "7", "--timeout", "2m")
	if len(first) != 5 || len(second) != 7 {
		t.Fatalf("runs wrote %d and %d records, want 5 and 7", len(first), len(second))
	}
	seen := map[string]string{}
	for _, l := range append(first, second...) {
		if prev, dup := seen[l.at]; dup {
			t.Errorf("%s written twice: %s and %s", l.at, prev, l.file)
		}
		seen[l.at] = l.file
		got, err := os.ReadFile(l.file)
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[filepath.Base(l.file)]
		if !ok || !bytes.Equal(got, w) {
			t.Errorf("%s: %s holds %d bytes, not the file produced under that name", l.at, l.file, len(got))
		}
		delete(want, filepath.Base(l.file))
	}
	if len(want) != 0 {
		t.Errorf("never written: %v", want)
	}
	committedMatchesEnd(t, group, topic)

	// Nothing new: a short --timeout ends the run with no record.
	if third := consume(filepath.Join(dir, "out3"), "--group", group, "--timeout", "3s"); len(third) != 0 {
		t.Errorf("third run wrote %v, want nothing", third)
	}

	// One more record: the group (named by the property this time) reads it alone.
	late := filepath.Join(src, "late.bin")
	if err := os.WriteFile(late, []byte("late"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "produce", "--brokers", b, "--topic", topic, "--store", store, late); code != 0 {
		t.Fatalf("produce exited %d: %s", code, errs)
	}
	fourth := consume(filepath.Join(dir, "out4"), "-X", "group.id="+group, "-n", "1", "--timeout", "2m")
	if len(fourth) != 1 || filepath.Base(fourth[0].file) != "late.bin" {
		t.Errorf("fourth run wrote %v, want late.bin alone", fourth)
	}
	committedMatchesEnd(t, group, topic)
}

// A record whose payload is gone stops ferry consume --group with the error
// ferry consume gives without a group, and the group's offset stays at that
// record: the record before it is committed, the next run stops at it again.
func TestCLIConsumeGroupUnreadableNotCommitted(t *testing.T) {
	b := brokers(t)
	store := fileStoreURL(t)
	topic := newTopic(t, nil)
	group := "ferry-it-group-" + topic
	dir := t.TempDir()
	var files []string
	for i, size := range []int{10, 100 << 10, 10} {
		p := filepath.Join(dir, fmt.Sprintf("r%d.bin", i))
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte('a' + i)}, size), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	if code, _, errs := runCLI(t, append([]string{"produce", "--brokers", b, "--topic", topic, "--store", store, "-X" + largemessage.KeyThreshold + "=65536"}, files...)...); code != 0 {
		t.Fatalf("produce exited %d: %s", code, errs)
	}
	raw := consumeRaw(t, topic, 3)
	st := openStore(t, store)
	if err := st.Delete(context.Background(), valuePath(t, raw[1])); err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ {
		code, out, errs := runCLI(t, "consume", "--brokers", b, "--topic", topic, "--store", store, "--out", filepath.Join(dir, fmt.Sprint("out", run)), "--group", group, "--timeout", "2m")
		if code != 1 || !strings.Contains(errs, "partition 0 offset 1") {
			t.Errorf("run %d: exit %d, stderr %q: want 1 and an error naming partition 0 offset 1", run, code, errs)
		}
		lines := parseConsumeLines(t, out)
		switch {
		case run == 1 && (len(lines) != 1 || lines[0].at != topic+"/0@0"):
			t.Errorf("run 1 wrote %v, want %s/0@0 alone", lines, topic)
		case run == 2 && len(lines) != 0:
			t.Errorf("run 2 wrote %v, want nothing (offset 0 was committed)", lines)
		}
		committed, err := kadm.NewClient(client(t)).FetchOffsets(ctxT(t, 30*time.Second), group)
		if err != nil {
			t.Fatal(err)
		}
		if c, ok := committed.Lookup(topic, 0); !ok || c.At != 1 {
			t.Errorf("run %d: committed offset %d (found %v), want 1", run, c.At, ok)
		}
	}
}

// Two ferry consume processes in one group split a four-partition topic's
// partitions: each writes some of the 40 records, together each record
// once; on SIGTERM each commits what it wrote (no periodic commit comes
// first) and leaves the group.
func TestCLIConsumeGroupTwoMembers(t *testing.T) {
	b := brokers(t)
	bin := buildFerry(t)
	topic := newTopicPartitions(t, 4, nil)
	group := "ferry-it-group-" + topic
	dir := t.TempDir()
	var ps []*ferryProc
	for i := range 2 {
		ps = append(ps, startFerryProc(t, bin, "consume", "--brokers", b, "--topic", topic, "--group", group,
			"--out", filepath.Join(dir, fmt.Sprint("out", i)), "--timeout", "0",
			// No periodic commit within the test: what is committed, is
			// committed on exit.
			"-X", "auto.commit.interval.ms=3600000"))
	}
	// Both members hold partitions before any record is produced.
	adm := kadm.NewClient(client(t))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		dg, err := adm.DescribeGroups(ctxT(t, 30*time.Second), group)
		if err == nil {
			if g, ok := dg[group]; ok && g.State == "Stable" && len(g.Members) == 2 {
				held := 0
				for _, m := range g.Members {
					if a, ok := m.Assigned.AsConsumer(); ok && len(a.Topics) > 0 && len(a.Topics[0].Partitions) > 0 {
						held++
					}
				}
				if held == 2 {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two consumers did not both hold partitions of group %s within 2 minutes (%v)", group, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cl := client(t)
	var recs []*kgo.Record
	for i := range 40 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprint("v", i))})
	}
	if err := cl.ProduceSync(ctxT(t, time.Minute), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	total := 0
	wait := time.After(2 * time.Minute)
	for total < 40 {
		select {
		case l := <-ps[0].lines:
			got[strings.Fields(l)[0]]++
			total++
		case l := <-ps[1].lines:
			got[strings.Fields(l)[0]]++
			total++
		case <-wait:
			t.Fatalf("%d of 40 records written within 2 minutes", total)
		}
	}
	for i, p := range ps {
		p.interrupt(t, syscall.SIGTERM)
		if p.code != 143 {
			t.Errorf("consumer %d: exit %d, want 143", i, p.code)
		}
		if len(p.stdout) == 0 {
			t.Errorf("consumer %d wrote nothing: the partitions were not split", i)
		}
	}
	if len(got) != 40 {
		t.Errorf("%d distinct records written, want 40", len(got))
	}
	for at, n := range got {
		if n != 1 {
			t.Errorf("%s written %d times", at, n)
		}
	}
	committedMatchesEnd(t, group, topic)
}
