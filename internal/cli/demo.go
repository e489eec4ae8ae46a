package cli

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

const (
	demoTopic           = "ferry-demo"
	demoPartitions      = 3
	demoMaxMessageBytes = largemessage.DefaultMaxMessageBytes // Kafka's default message.max.bytes, 1048588

	// Machine files picked by default: regular files of 1 MiB to 200 MiB,
	// at most 300 MiB and 4 files in all (the executable included).
	machineMin, machineMax     = 1 << 20, 200 << 20
	machineBudget, machineN    = 300 << 20, 4
	machineScanLimit           = 50000 // directory entries looked at
	demoConsumeTimeout         = 3 * time.Minute
	demoSmallMin, demoSmallMax = 200, 100 << 10
)

type demoFlags struct {
	files          []string
	records        int
	progress       bool
	noMachineFiles bool
}

func (a *app) demoCommand() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo [--file PATH]...",
		Short: "Round-trip small records and large real files through an in-process Kafka",
		Long: `Start an in-process Kafka (franz-go kfake, one broker, message.max.bytes
1048588) and a file payload store in a temporary folder, create a topic, and
produce a mix of records: small ones, two at the exact inline limit (one
byte apart), two large in-memory ones, and large real files -- the ferry
executable and up to three other files of 1-200 MiB found in /usr/bin and
/usr/lib (300 MiB at most), plus any --file. Large files are streamed to the
store, never read into memory. Everything is consumed back, each value's
SHA-256 compared with its source's, and a summary table printed.

Exit status 0 only when every record came back identical. The temporary
folder is removed at the end. Properties such as -X compression.type=zstd
apply; bootstrap.servers and the store URL are the demo's own.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.demo(cmd.Context(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.files, "file", nil, "also produce the file at `PATH` (repeatable)")
	fl.IntVar(&f.records, "records", 200, "number of small records (a few hundred bytes to 100 KiB)")
	fl.BoolVar(&f.progress, "progress", false, "show progress bars even when stderr is not a terminal")
	fl.BoolVar(&f.noMachineFiles, "no-machine-files", false, "do not produce the executable and files found on the machine")
	_ = fl.MarkHidden("no-machine-files")
	return cmd
}

// demoItem is one produced record and what became of it.
type demoItem struct {
	group, name, key string
	size             int64
	sha              [sha256.Size]byte
	file             bool

	seen, offloaded bool
	kafkaBytes      int64
	err             error
}

func (it *demoItem) match() bool { return it.seen && it.err == nil }

func (a *app) demo(ctx context.Context, f demoFlags) error {
	if f.records < 0 {
		return usageErrorf("demo: --records %d: must be 0 or more", f.records)
	}
	for _, p := range f.files {
		st, err := os.Stat(p)
		if err != nil {
			return usageErrorf("demo: --file: %v", err)
		}
		if !st.Mode().IsRegular() {
			return usageErrorf("demo: --file %s: not a regular file", p)
		}
	}
	s, err := a.loadSettings("", "", false)
	if err != nil {
		return err
	}
	files := slices.Clone(f.files)
	if !f.noMachineFiles {
		files = append(machineFiles(files), files...)
	}

	tmp, err := os.MkdirTemp("", "ferry-demo-*")
	if err != nil {
		return err
	}
	leftBehind.Store(&tmp)
	defer func() {
		os.RemoveAll(tmp)
		leftBehind.Store(nil)
	}()
	storeDir := filepath.Join(tmp, "payloads")

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": fmt.Sprint(demoMaxMessageBytes)}))
	if err != nil {
		return fmt.Errorf("starting the in-process Kafka: %w", err)
	}
	defer cluster.Close()
	s.brokers = cluster.ListenAddrs()
	s.cfg.StoreURL = "file://" + filepath.ToSlash(storeDir)

	snd, cl, closeAll, err := s.openSender(ctx, f.progress || isTerminal(a.stderr), a.stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, demoPartitions, 1, nil, demoTopic); err != nil {
		return fmt.Errorf("creating topic %s: %w", demoTopic, err)
	}
	l, cut := snd.cutoff(ctx, demoTopic)

	w := a.stdout
	fmt.Fprintf(w, "ferry demo: in-process Kafka (kfake, 1 broker, message.max.bytes=%d) at %s\n", demoMaxMessageBytes, strings.Join(s.brokers, ","))
	fmt.Fprintf(w, "  topic %s (%d partitions), compression %s, payload store %s\n", demoTopic, demoPartitions, cmp.Or(s.cfg.Codec.Type, "none"), s.cfg.StoreURL)
	fmt.Fprintf(w, "  inline limit: threshold %d bytes (max.message.bytes %d, client batch cap %d)\n\n", l.Threshold, l.MaxMessageBytes, l.ClientBatchMaxBytes)

	// Produce.
	var items []*demoItem
	rng := rand.New(rand.NewChaCha8([32]byte{'f', 'e', 'r', 'r', 'y'}))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := 0; i < n; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < n; j++ {
				b[i+j] = byte(v >> (8 * j))
			}
		}
		return b
	}
	var produced int64
	start := time.Now()

	// Small records, in one ProduceSync.
	recs := make([]*kgo.Record, 0, f.records)
	byRec := map[*kgo.Record]*demoItem{}
	for i := range f.records {
		lo, hi := math.Log(demoSmallMin), math.Log(demoSmallMax)
		v := randBytes(int(math.Exp(lo + (hi-lo)*rng.Float64())))
		it := &demoItem{group: "small", key: fmt.Sprintf("small-%04d", i), size: int64(len(v)), sha: sha256.Sum256(v)}
		r := &kgo.Record{Topic: demoTopic, Key: []byte(it.key), Value: v}
		recs = append(recs, r)
		byRec[r] = it
		items = append(items, it)
		produced += it.size
	}
	if len(recs) > 0 {
		for _, res := range snd.prod.ProduceSync(ctx, recs...) {
			if res.Err != nil {
				return fmt.Errorf("producing %s: %w", byRec[res.Record].key, res.Err)
			}
		}
	}

	// In-memory records decided by the serializer: two at the exact limit,
	// one byte apart, and two large ones.
	type mem struct {
		group, key string
		n          int
	}
	var mems []mem
	if n, ok := largestInline(s.cfg.Codec, l, cut, len("boundary-fits"), randBytes(int(cut)+1)); ok {
		mems = append(mems, mem{"boundary", "boundary-fits", n}, mem{"boundary", "boundary-over", n + 1})
	}
	mems = append(mems, mem{"in-memory", "memory-1.5MiB", 3 << 19}, mem{"in-memory", "memory-3MiB", 3 << 20})
	for _, m := range mems {
		v := randBytes(m.n)
		res, err := snd.sendBytes(ctx, demoTopic, m.key, []byte(m.key), v, nil)
		if err != nil {
			return err
		}
		items = append(items, &demoItem{group: m.group, key: m.key, size: res.Size, sha: res.SHA256})
		produced += res.Size
	}

	// Files, streamed when large.
	for i, p := range files {
		key := fmt.Sprintf("file-%d-%s", i, filepath.Base(p))
		res, err := snd.sendFile(ctx, demoTopic, p, []byte(key), p)
		if err != nil {
			return err
		}
		items = append(items, &demoItem{group: "files", name: p, key: key, size: res.Size, sha: res.SHA256, file: true})
		produced += res.Size
	}
	produceTime := time.Since(start)

	// Consume everything back, streaming each value into a hasher.
	start = time.Now()
	if err := demoConsume(ctx, s, snd.store, items); err != nil {
		return err
	}
	consumeTime := time.Since(start)

	storeBytes, storeObjects := dirUsage(storeDir)
	a.demoReport(items, produced, produceTime, consumeTime, storeBytes, storeObjects)

	bad := 0
	for _, it := range items {
		if !it.match() {
			bad++
		}
	}
	if bad > 0 {
		for _, it := range items {
			if !it.match() {
				why := "never consumed"
				if it.err != nil {
					why = it.err.Error()
				}
				fmt.Fprintf(a.stderr, "ferry: demo: %s: %s\n", it.key, oneLine(why))
			}
		}
		return fmt.Errorf("demo FAILED: %d of %d records did not come back identical", bad, len(items))
	}
	fmt.Fprintf(w, "\nOK: all %d records came back with matching SHA-256\n", len(items))
	return nil
}

// largestInline finds, by bisection with the serializer's exact sizing, the
// largest value that still fits inline with a key of keyLen bytes.
func largestInline(codec largemessage.Codec, l largemessage.Limits, cut int64, keyLen int, buf []byte) (int, bool) {
	key := make([]byte, keyLen)
	fits := func(n int) bool {
		ok, err := codec.Fits(l, key, buf[:n], nil)
		return err == nil && ok
	}
	lo, hi := 0, int(cut)+1 // fits(lo), !fits(hi)
	if !fits(lo) || fits(hi) {
		return 0, false
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, true
}

// demoConsume reads the topic from the start with a fresh client until
// every item was seen, resolving each value with Deserializer.OpenValue into
// a SHA-256 hasher.
func demoConsume(ctx context.Context, s *settings, store payloadstore.PayloadStore, items []*demoItem) error {
	ctx, cancel := context.WithTimeout(ctx, demoConsumeTimeout)
	defer cancel()
	cl, err := s.connect(ctx, kgo.ConsumeTopics(demoTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	de := largemessage.NewDeserializer(store, false)
	byKey := make(map[string]*demoItem, len(items))
	for _, it := range items {
		byKey[it.key] = it
	}
	left := len(items)
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("consuming %s: %d of %d records still missing after %s", demoTopic, left, len(items), demoConsumeTimeout)
			}
			return ctx.Err()
		}
		if err := fs.Err0(); err != nil {
			return fmt.Errorf("consuming %s: %w", demoTopic, err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil {
				ferr = fmt.Errorf("consuming topic %s partition %d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		for _, r := range fs.Records() {
			it := byKey[string(r.Key)]
			if it == nil || it.seen {
				continue
			}
			it.seen, left = true, left-1
			it.offloaded = largemessage.IsOffloaded(r)
			it.kafkaBytes = recordBytes(r)
			it.err = hashValue(ctx, de, r, it.sha)
		}
	}
	return nil
}

// hashValue streams r's resolved value into SHA-256 and compares it with want.
func hashValue(ctx context.Context, de *largemessage.Deserializer, r *kgo.Record, want [sha256.Size]byte) error {
	rc, _, err := de.OpenValue(ctx, r)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return err
	}
	if got := h.Sum(nil); string(got) != string(want[:]) {
		return fmt.Errorf("SHA-256 %x, source has %x", got, want)
	}
	return nil
}

func (a *app) demoReport(items []*demoItem, produced int64, produceTime, consumeTime time.Duration, storeBytes int64, storeObjects int) {
	type row struct {
		records, inline, offloaded int
		kafka, stored              int64
	}
	groups := []string{"small", "boundary", "in-memory", "files"}
	rows := map[string]*row{}
	total := &row{}
	for _, it := range items {
		r := rows[it.group]
		if r == nil {
			r = &row{}
			rows[it.group] = r
		}
		for _, r := range []*row{r, total} {
			r.records++
			r.kafka += it.kafkaBytes
			if it.offloaded {
				r.offloaded++
				r.stored += it.size
			} else {
				r.inline++
			}
		}
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "records      \tcount\tinline\toffloaded\tbytes in Kafka\tbytes in store\t")
	line := func(name string, r *row) {
		fmt.Fprintf(tw, "%-13s\t%d\t%d\t%d\t%s\t%s\t\n", name, r.records, r.inline, r.offloaded, humanBytes(r.kafka), humanBytes(r.stored))
	}
	for _, g := range groups {
		if r := rows[g]; r != nil {
			line(g, r)
		}
	}
	line("total", total)
	tw.Flush()
	fmt.Fprintf(a.stdout, "  store folder: %d objects, %s on disk\n\n", storeObjects, humanBytes(storeBytes))
	rate := func(d time.Duration) string {
		return fmt.Sprintf("%.1f MB/s", float64(produced)/1e6/max(d.Seconds(), 1e-9))
	}
	fmt.Fprintf(a.stdout, "produce  %s in %s = %s (hash, upload, produce)\n", humanBytes(produced), produceTime.Round(time.Millisecond), rate(produceTime))
	fmt.Fprintf(a.stdout, "consume  %s in %s = %s (fetch, download, verify)\n\n", humanBytes(produced), consumeTime.Round(time.Millisecond), rate(consumeTime))

	tw = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "file\tsize\tbytes\toffloaded\tmatch")
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	for _, it := range items {
		if it.group == "small" {
			continue
		}
		name := it.name
		if name == "" {
			name = it.key + " (generated)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", name, humanBytes(it.size), it.size, yes(it.offloaded), yes(it.match()))
	}
	tw.Flush()
}

// machineFiles returns the running executable and up to three other real
// files of machineMin..machineMax bytes from /usr/bin and /usr/lib: the
// largest, a middle one and the smallest that fit the budget. skip lists
// files already chosen.
func machineFiles(skip []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range skip {
		if abs, err := filepath.Abs(p); err == nil {
			seen[abs] = true
		}
	}
	budget := int64(machineBudget)
	if exe, err := os.Executable(); err == nil {
		if st, err := os.Stat(exe); err == nil && st.Mode().IsRegular() && st.Size() <= budget && !seen[exe] {
			out = append(out, exe)
			seen[exe] = true
			budget -= st.Size()
		}
	}
	type cand struct {
		path string
		size int64
	}
	var cands []cand
	visited := 0
	for _, root := range []struct {
		dir   string
		depth int
	}{{"/usr/bin", 1}, {"/usr/lib", 3}} {
		base := strings.Count(root.dir, "/")
		filepath.WalkDir(root.dir, func(p string, d fs.DirEntry, err error) error {
			visited++
			if visited > machineScanLimit {
				return filepath.SkipAll
			}
			if err != nil {
				return nil
			}
			if d.IsDir() {
				if strings.Count(p, "/")-base >= root.depth {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() || seen[p] {
				return nil
			}
			info, err := d.Info()
			if err != nil || info.Size() < machineMin || info.Size() > machineMax {
				return nil
			}
			cands = append(cands, cand{p, info.Size()})
			return nil
		})
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(b.size, a.size) })
	readable := func(p string) bool {
		f, err := os.Open(p)
		if err != nil {
			return false
		}
		f.Close()
		return true
	}
	pick := func(order []int) {
		for _, i := range order {
			c := cands[i]
			if len(out) >= machineN || seen[c.path] || c.size > budget || !readable(c.path) {
				continue
			}
			out = append(out, c.path)
			seen[c.path] = true
			budget -= c.size
			return
		}
	}
	idx := make([]int, len(cands))
	for i := range idx {
		idx[i] = i
	}
	rev := slices.Clone(idx)
	slices.Reverse(rev)
	mid := len(cands) / 2
	pick(idx)                                           // the largest that fits
	pick(append(slices.Clone(idx[mid:]), idx[:mid]...)) // a middle one
	pick(rev)                                           // the smallest
	return out
}

// dirUsage sums the sizes of the regular files under dir.
func dirUsage(dir string) (bytes int64, files int) {
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				bytes += info.Size()
				files++
			}
		}
		return nil
	})
	return bytes, files
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
