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
	brokers, topic, store string
	grace                 time.Duration
	dryRun                bool
}

func (a *app) gcCommand() *cobra.Command {
	var f gcFlags
	cmd := &cobra.Command{
		Use:   "gc --brokers HOST:PORT[,...] --topic TOPIC --store URL [--grace DURATION] [--dry-run]",
		Short: "Delete payloads of a topic that no live record references",
		Long: `Delete the objects under TOPIC's prefix in the payload store that no live
record of TOPIC references and that are older than --grace (default 24h).

The store is listed first, then the topic is read from the start of every
partition to its last stable offset (read_committed: aborted records hold
nothing). Live records are every record still in the log, or, when the
topic's cleanup.policy contains compact, the latest record of each key (a key
whose latest record is a tombstone holds no value payload; an offloaded key
is kept while any record carrying it is in the log). A record whose
reference does not decode, or a read that does not complete, stops ferry
before anything is deleted.

--grace must exceed the longest time between a payload's publish and its
record's produce (producer retries, transaction.max.timeout.ms): a payload
not yet referenced looks like garbage. --dry-run deletes nothing and lists
what would be deleted, one full path per line.

A summary goes to standard output: objects listed, kept (referenced, newer
than the grace period), deleted and bytes freed.`,
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
	fl.BoolVar(&f.dryRun, "dry-run", false, "delete nothing; list what would be deleted")
	return cmd
}

func (a *app) gc(ctx context.Context, f gcFlags) error {
	if f.topic == "" {
		return usageErrorf("gc: --topic is required (see ferry gc --help)")
	}
	if f.grace < 0 {
		return usageErrorf("gc: --grace %s: must be 0 or more", f.grace)
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
	sum, err := lifecycle.Collect(ctx, cl, store, lifecycle.Options{
		Topic: f.topic, Grace: f.grace, GraceSet: true, DryRun: f.dryRun,
		Progress: func(p lifecycle.Progress) {
			if bar == nil {
				return
			}
			switch p.Phase {
			case "list":
				bar.Describe(fmt.Sprintf("gc: %d objects listed", p.Listed))
			case "read":
				bar.Describe(fmt.Sprintf("gc: %d objects listed, %d records read", p.Listed, p.RecordsRead))
			case "delete":
				bar.Describe(fmt.Sprintf("gc: %d records read, %d objects checked, %d deleted", p.RecordsRead, p.Checked, p.Deleted))
			}
			bar.Add(1)
		},
	})
	if bar != nil {
		bar.Finish()
	}
	if err == nil || sum.Deleted > 0 || sum.Failed > 0 { // a failed run that deleted nothing gets no summary
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
	fmt.Fprintf(w, "topic %s (cleanup.policy=%s): %d records read, %d live references\n", f.topic, policy, sum.RecordsRead, sum.LiveReferences)
	fmt.Fprintf(w, "objects: %d listed, %d kept referenced, %d kept newer than %s (not checked), %d %s, %d %s",
		sum.Listed, sum.Referenced, sum.TooNew, f.grace, sum.Deleted, verb, sum.BytesFreed, freed)
	if sum.Failed > 0 {
		fmt.Fprintf(w, ", %d failed", sum.Failed)
	}
	fmt.Fprintln(w)
}
