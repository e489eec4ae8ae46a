package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/lifecycle"
)

type gcFlags struct {
	brokers, topic, store, mode string
	grace, settle               time.Duration
	dryRun                      bool
	mirrors                     []string
}

func (a *app) gcCommand() *cobra.Command {
	var f gcFlags
	cmd := &cobra.Command{
		Use:   "gc --brokers HOST:PORT[,...] --topic TOPIC --store URL [--grace DURATION] [--settle DURATION] [--mode auto|full|checkpoint] [--mirror TOPIC]... [--dry-run]",
		Short: "Delete payloads of a topic that no live record references",
		Long: `Delete the objects under TOPIC's prefix in the payload store that no live
record of TOPIC references and that are older than --grace (default 24h).

Deciding. With a full read, the store is listed first, then the topic is
read from the start of every partition to its last stable offset
(read_uncommitted: a record of an aborted transaction is read by Kafka's
default consumers and holds its payload while in the log), partitions in
parallel. Live records are every record still in the log, or, when the
topic's cleanup.policy contains compact, every transactional record still in
the log and the latest other record of each key (a key whose
latest record is a tombstone holds no value payload; an offloaded key is
kept while any record carrying it is in the log). A topic with
cleanup.policy=delete is not read once retention has passed a checkpoint:
every run stores one (gc's clock, then the partitions' high watermarks)
under TOPIC/.ferry-gc/checkpoints, and once every partition's log start
offset has reached a checkpoint's offsets, an object whose age exceeds
--grace at the checkpoint's time is garbage; others are kept. --mode auto
(default) uses a checkpoint when one is usable and reads the topic
otherwise; full always reads; checkpoint never does.

Removing. Garbage is first moved to TOPIC/.ferry-gc/q/RUN/ (an object
republished or touched since the listing stays). After --settle (default 10m)
the records appended since the decision are read (read_uncommitted) and
every quarantined object one of them references is moved back; the records
appended during that read are checked once more, and when one of them
references a quarantined object (acknowledged later than --settle allows)
everything is moved back, nothing is deleted, and gc exits 1 naming the
record; the rest is deleted, and records appended meanwhile are checked for
references to what was deleted (reported the same way). A run that was interrupted leaves its folder; the next run finishes
it by the same rule. A record whose reference does not decode, or a read
that does not complete, stops ferry before anything is deleted (after the
quarantine: everything is moved back).

--mirror TOPIC (repeatable) names a topic of the same cluster whose records
are byte-for-byte copies of TOPIC's (a mirror its consumers read with
large.message.reference.resolve.topics): its references keep TOPIC's objects
too. With a mirror every run reads (--mode full).

Producers that confirm their objects after the acknowledgement (Ferry's Go
Producer, ferry produce, the proxy's large-message interceptor) bring back
an object gc quarantined or deleted while their acknowledgement was on its
way, whatever its delay; the timing rules below protect the records of
producers that do not (other libraries, a producer killed between the
broker's append and its confirmation).

--grace must exceed the longest time between a payload's publish (or touch)
and its record's acknowledgement (producer retries,
transaction.max.timeout.ms), plus the clock skew between the store and this
host. --settle must exceed the longest time between a publish (or touch) and
its record's acknowledgement (delivery.timeout.ms; for a transaction, the
produce, not the commit). During the settle time a
consumer resolving a record that races the quarantine gets
ErrPayloadNotFound until the object is restored. --dry-run moves and deletes
nothing, stores no checkpoint, and lists what would be deleted, one full
path per line.

A summary goes to standard output: records read, objects listed, kept
(referenced, newer than the grace period, not provably garbage, changed),
restored, deleted and bytes freed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.gc(cmd.Context(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.brokers, "brokers", "", "Kafka bootstrap servers, `HOST:PORT[,...]` (property bootstrap.servers)")
	fl.StringVarP(&f.topic, "topic", "t", "", "topic whose payloads to collect (required)")
	fl.StringVar(&f.store, "store", "", "payload store `URL` or directory (property "+largemessage.KeyStoreURL+"; required)")
	fl.DurationVar(&f.grace, "grace", lifecycle.DefaultGrace, "never delete objects newer than this `DURATION`")
	fl.DurationVar(&f.settle, "settle", lifecycle.DefaultSettle, "keep quarantined objects this `DURATION` before rechecking the appended records")
	fl.StringVar(&f.mode, "mode", string(lifecycle.ModeAuto), "how garbage is found: auto, full (read the topic) or checkpoint (delete-policy topics; never read the topic)")
	fl.BoolVar(&f.dryRun, "dry-run", false, "delete nothing; list what would be deleted")
	fl.StringArrayVar(&f.mirrors, "mirror", nil, "a mirror `TOPIC` whose records reference this topic's objects (repeatable)")
	return cmd
}

func (a *app) gc(ctx context.Context, f gcFlags) error {
	if f.topic == "" {
		return usageErrorf("gc: --topic is required (see ferry gc --help)")
	}
	if f.grace < 0 {
		return usageErrorf("gc: --grace %s: must be 0 or more", f.grace)
	}
	if f.settle < 0 {
		return usageErrorf("gc: --settle %s: must be 0 or more", f.settle)
	}
	mode, err := lifecycle.ParseMode(f.mode)
	if err != nil {
		return usageErrorf("gc: --mode %s: want auto, full or checkpoint", f.mode)
	}
	s, err := a.loadSettings(f.brokers, f.store, true)
	if err != nil {
		return err
	}
	if s.cfg.StoreURL == "" {
		return usageErrorf("gc: --store (or the property %s) is required", largemessage.KeyStoreURL)
	}
	s.readOnly = true
	store, cl, closeAll, err := s.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll()

	var bar *progressbar.ProgressBar
	if isTerminal(a.stderr) {
		bar = progressbar.NewOptions64(-1,
			progressbar.OptionSetWriter(a.stderr),
			progressbar.OptionSetDescription("gc"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
		defer bar.Finish()
	}
	settling := false
	sum, err := lifecycle.Collect(ctx, cl, store, lifecycle.Options{
		Topic: f.topic, Grace: f.grace, GraceSet: true, Settle: f.settle, SettleSet: true, Mode: mode, DryRun: f.dryRun, Mirrors: f.mirrors,
		Progress: func(p lifecycle.Progress) {
			if bar == nil {
				if p.Phase == "settle" && !settling {
					// Without a terminal nothing else would be written
					// for the whole --settle (10 minutes by default).
					settling = true
					fmt.Fprintf(a.stderr, "gc: %d objects quarantined; waiting --settle %s before rechecking the records appended meanwhile (at %s)\n",
						p.Quarantined, f.settle, time.Now().Add(f.settle).Format(time.TimeOnly))
				}
				return
			}
			switch p.Phase {
			case "list":
				bar.Describe(fmt.Sprintf("gc: %d objects listed", p.Listed))
			case "read":
				bar.Describe(fmt.Sprintf("gc: %d objects listed, %d records read", p.Listed, p.RecordsRead))
			case "quarantine":
				bar.Describe(fmt.Sprintf("gc: %d candidates checked, %d quarantined", p.Checked, p.Quarantined))
			case "settle":
				bar.Describe(fmt.Sprintf("gc: %d quarantined, waiting %s", p.Quarantined, f.settle))
			case "recheck":
				bar.Describe(fmt.Sprintf("gc: %d quarantined, %d appended records read", p.Quarantined, p.Rechecked))
			case "late":
				bar.Describe(fmt.Sprintf("gc: %d quarantined, checking the records appended during the recheck", p.Quarantined))
			case "finish":
				bar.Describe(fmt.Sprintf("gc: %d restored, %d deleted", p.Restored, p.Deleted))
			}
			bar.Add(1)
		},
	})
	if bar != nil {
		bar.Finish()
	}
	if err == nil || sum.Quarantined > 0 || sum.Deleted > 0 || sum.Failed > 0 || sum.LeftoverRuns > 0 || len(sum.LateReferences) > 0 { // a failed run that changed nothing gets no summary
		a.gcSummary(f, sum)
	}
	return err
}

func (a *app) gcSummary(f gcFlags, sum lifecycle.Summary) {
	w := a.stdout
	policy := "delete"
	if sum.Compacted {
		policy = "compact"
	}
	verb, freed := "deleted", "bytes freed"
	if f.dryRun {
		verb, freed = "would delete", "bytes would be freed"
	}
	for _, c := range sum.Candidates { // each path, for the audit trail
		fmt.Fprintf(w, "%s %s (%d bytes)\n", verb, c.FullPath, c.Size)
	}
	for _, c := range sum.RestoredObjects {
		fmt.Fprintf(w, "restored %s (%d bytes): referenced by a record appended since it was quarantined\n", c.FullPath, c.Size)
	}
	for _, l := range sum.LateReferences {
		state := "quarantined: everything restored, nothing deleted"
		if l.Deleted {
			state = "already deleted: lost unless its producer confirms it"
		}
		fmt.Fprintf(w, "late: topic %s partition %d offset %d references %s, appended after the recheck (%s; raise --settle)\n", l.Topic, l.Partition, l.Offset, l.Object, state)
	}
	for _, c := range sum.LeftoverDeletedObjects {
		fmt.Fprintf(w, "deleted %s (%d bytes): left in quarantine by an interrupted run\n", c.FullPath, c.Size)
	}
	switch {
	case sum.Mode == lifecycle.ModeCheckpoint && sum.Checkpoint.IsZero():
		fmt.Fprintf(w, "topic %s (cleanup.policy=%s): mode checkpoint, no checkpoint passed by retention yet: nothing provably garbage\n", f.topic, policy)
	case sum.Mode == lifecycle.ModeCheckpoint:
		fmt.Fprintf(w, "topic %s (cleanup.policy=%s): mode checkpoint (retention passed the checkpoint of %s), 0 records read, %d appended records rechecked\n",
			f.topic, policy, sum.Checkpoint.Format(time.RFC3339), sum.Rechecked)
	default:
		fmt.Fprintf(w, "topic %s (cleanup.policy=%s): mode full, %d records read, %d live references, %d appended records rechecked\n",
			f.topic, policy, sum.RecordsRead, sum.LiveReferences, sum.Rechecked)
	}
	fmt.Fprintf(w, "objects: %d listed, %d kept referenced, %d kept newer than %s (not checked)", sum.Listed, sum.Referenced, sum.TooNew, f.grace)
	if sum.Mode == lifecycle.ModeCheckpoint {
		fmt.Fprintf(w, ", %d kept not provably garbage", sum.Unproven)
	}
	if sum.Changed > 0 {
		fmt.Fprintf(w, ", %d kept changed during the run", sum.Changed)
	}
	if !f.dryRun {
		fmt.Fprintf(w, ", %d quarantined, %d restored", sum.Quarantined, sum.Restored)
	}
	fmt.Fprintf(w, ", %d %s, %d %s", sum.Deleted, verb, sum.BytesFreed, freed)
	if sum.Failed > 0 {
		fmt.Fprintf(w, ", %d failed", sum.Failed)
	}
	fmt.Fprintln(w)
	if sum.LeftoverRuns > 0 {
		if f.dryRun {
			fmt.Fprintf(w, "quarantine: %d folders of interrupted runs (the next run finishes them)\n", sum.LeftoverRuns)
		} else {
			fmt.Fprintf(w, "quarantine: %d folders of interrupted runs finished, %d objects restored, %d deleted, %d bytes freed\n",
				sum.LeftoverRuns, sum.LeftoverRestored, sum.LeftoverDeleted, sum.LeftoverBytesFreed)
		}
	}
	if left := sum.Quarantined - sum.Restored - sum.Deleted - sum.Failed; left > 0 && !f.dryRun {
		fmt.Fprintf(w, "quarantine: %d objects of this run stay in %s/.ferry-gc/q/%s/ (the run did not finish); the next ferry gc of the topic restores those a record references and deletes the rest\n",
			left, f.topic, sum.RunID)
	}
}
