package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

type produceFlags struct {
	brokers, topic, store, key string
	keySet, progress           bool
}

func (a *app) produceCommand() *cobra.Command {
	var f produceFlags
	cmd := &cobra.Command{
		Use:   "produce --brokers HOST:PORT[,...] --topic TOPIC [--store URL] [--key KEY] FILE...|-",
		Short: "Produce each FILE (or standard input, \"-\") as one record",
		Long: `Produce each FILE as one record: the value is the file's bytes, the key is
--key or the file's base name (standard input, "-", has no key unless --key
is given).

A file larger than the topic accepts inline (its max.message.bytes, the
client's max.request.size, large.message.threshold.bytes) is streamed: it is
hashed and uploaded to the payload store from disk, never held in memory, and
Kafka gets a small reference. Smaller inputs are decided exactly by the
large-message serializer. Standard input is read into memory up to that limit
and spooled to a temporary file beyond it.

--store (or large.message.payload.store.url) names the payload store, e.g.
file:///var/ferry or a directory path; it is needed only when a record must
be offloaded. One line per record goes to standard output:
  TOPIC/PARTITION@OFFSET SIZE bytes inline
  TOPIC/PARTITION@OFFSET SIZE bytes offloaded FULL-PAYLOAD-PATH`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("produce: name at least one FILE, or - for standard input (see ferry produce --help)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			f.keySet = cmd.Flags().Changed("key")
			return a.produce(cmd.Context(), f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.brokers, "brokers", "", "Kafka bootstrap servers, `HOST:PORT[,...]` (property bootstrap.servers)")
	fl.StringVarP(&f.topic, "topic", "t", "", "topic to produce to (required)")
	fl.StringVar(&f.store, "store", "", "payload store `URL` or directory (property "+largemessage.KeyStoreURL+")")
	fl.StringVarP(&f.key, "key", "k", "", "record key for every input (default: the file's base name)")
	fl.BoolVar(&f.progress, "progress", false, "show progress bars even when stderr is not a terminal")
	return cmd
}

func (a *app) produce(ctx context.Context, f produceFlags, inputs []string) error {
	if f.topic == "" {
		return usageErrorf("produce: --topic is required (see ferry produce --help)")
	}
	stdinSeen := false
	for _, in := range inputs {
		if in == "-" {
			if stdinSeen {
				return usageErrorf("produce: \"-\" (standard input) can be given only once")
			}
			stdinSeen = true
			continue
		}
		st, err := os.Stat(in)
		if err != nil {
			return usageErrorf("produce: %v", err)
		}
		if !st.Mode().IsRegular() {
			return usageErrorf("produce: %s is not a regular file", in)
		}
	}
	s, err := a.loadSettings(f.brokers, f.store, true)
	if err != nil {
		return err
	}
	store, cl, closeAll, err := s.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	if err := checkTopic(ctx, cl, f.topic); err != nil {
		// As Kafka's console producer with auto.create.topics.enable:
		// a missing topic is created with the broker's defaults.
		resp, cerr := kadm.NewClient(cl).CreateTopic(ctx, -1, -1, nil, f.topic)
		if cerr == nil {
			cerr = resp.Err
		}
		if cerr != nil && !errors.Is(cerr, kerr.TopicAlreadyExists) {
			return fmt.Errorf("%v, and creating it failed: %w", err, cerr)
		}
		fmt.Fprintf(a.stderr, "ferry: created topic %s with the broker's default partitions and replication\n", f.topic)
	}
	prod, err := largemessage.NewProducer(cl, store, s.cfg)
	if err != nil {
		return &usageError{err: err}
	}
	snd := &sender{prod: prod, store: store, hasStore: s.cfg.StoreURL != "", codec: s.cfg.Codec,
		progress: f.progress || isTerminal(a.stderr), stderr: a.stderr}

	// Fail before producing anything when a file must be offloaded and no
	// store is set.
	if !snd.hasStore {
		l, cut := snd.cutoff(ctx, f.topic)
		for _, in := range inputs {
			if st, err := os.Stat(in); in != "-" && err == nil && st.Size() > cut {
				return snd.needStore(in, st.Size(), f.topic, l)
			}
		}
	}
	for _, in := range inputs {
		key := []byte(f.key)
		var res sent
		var err error
		if in == "-" {
			if !f.keySet {
				key = nil
			}
			res, err = snd.sendStdin(ctx, f.topic, "-", key, a.stdin)
		} else {
			if !f.keySet {
				key = []byte(filepath.Base(in))
			}
			res, err = snd.sendFile(ctx, f.topic, in, key, in)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(a.stdout, res.line())
	}
	return nil
}
