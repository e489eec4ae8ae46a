package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ferrykit/ferry/interceptor"
	"github.com/ferrykit/ferry/internal/ctxio"
	"github.com/ferrykit/ferry/internal/schemareg"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/serde"
)

// defaultIdle is how long consume waits for a new record before it stops.
const defaultIdle = 10 * time.Second

type consumeFlags struct {
	brokers, topic, store, out, group string
	n                                 int
	fromBeginning, fromBeginningSet   bool
	idle                              time.Duration
}

func (a *app) consumeCommand() *cobra.Command {
	var f consumeFlags
	cmd := &cobra.Command{
		Use:   "consume --brokers HOST:PORT[,...] --topic TOPIC [--group GROUP] [--store URL] [--out DIR] [-n N] [--timeout DURATION]",
		Short: "Consume records, resolving large-message references, to files or standard output",
		Long: `Consume TOPIC from the start of every partition (--from-beginning=false or
auto.offset.reset=latest: only new records), without a consumer group unless
--group GROUP (or the property group.id) names one. Each record's value is resolved
through the payload store as it streams, its size and SHA-256 checked against
the record's headers, and written to a file in DIR (--out DIR; the file
appears only once it checked out) or to standard output, values back to back
(there a value streams out as it is read, so a digest mismatch is reported
after its bytes were written). With --out, one line per record goes to
standard output:
  TOPIC/PARTITION@OFFSET SIZE bytes inline|offloaded key="KEY" -> FILE
(key=null for a record without a key)
"offloaded": the record carried a reference, which ferry resolved through
--store; "inline": the record arrived carrying its value. Through a ferry
proxy running the large-message interceptor, every record arrives inline:
the proxy has resolved its reference already and removed Ferry's headers,
so that the record reads as produced, and ferry cannot tell it from a value
kept in Kafka.

The file is named after the file ferry produce sent (its base name, carried
in the header ferry.file.name), e.g. DIR/big.iso, and replaces a file of that
name in DIR. A record without that name (produced from standard input or by
another client) is written to DIR/TOPIC-PARTITION-OFFSET. A name written
before in the same run gets TOPIC-PARTITION-OFFSET- in front
(DIR/docs-0-7-big.iso), so no record replaces another's. A name that has a
directory part, starts with '.', or holds control characters is not used.

ferry stops after -n N records, or once no record has arrived for
--timeout (default 10s; 0 waits for ever, until Ctrl-C). Ctrl-C (SIGINT) or
SIGTERM stops it at once: exit 130 (143 for SIGTERM), saying how many
records were written.

A record that cannot be resolved (payload missing, digest mismatch, store
unreachable) stops ferry with an error naming its topic, partition and
offset, unless large.message.skip.not.found.error=true and the payload is
missing: then it is reported as a warning and skipped. Through a ferry
proxy, a record that will never be readable (CORRUPT_MESSAGE) stops it too,
as it stops kafka-console-consumer.

With --group GROUP, ferry joins the consumer group GROUP (franz-go's group
consumer; partition.assignment.strategy, default cooperative-sticky) and
reads each partition it is assigned from the group's committed offset; a
partition without one starts where --from-beginning or auto.offset.reset
says (as kafka-console-consumer --group does). It commits a record's offset
only once the record was written out (its payload read and verified,
its file renamed into place, or its bytes written to standard output) or
skipped: every auto.commit.interval.ms (default 5000), when the group takes
a partition away, and on exit (-n N reached, --timeout, Ctrl-C, SIGTERM, or
an error: then up to the last record written). The next run with the same
group starts after the last record written, so no record is written twice
and none is skipped. ferry leaves the group on exit, so the others take its
partitions at once. enable.auto.commit=false: join the group but commit
nothing. A failed final commit is an error: the records after the last
committed offset will be read again.

With -X value.deserializers=large-message,avro (or protobuf, json-schema)
and -X schema.registry.url=URL, each value is decoded under the schema its
Confluent framing names and written as one line of JSON: for Avro, close to
Avro's JSON encoding as kafka-avro-console-consumer prints it (fields in name
order, a union of null and a primitive type as its plain value, other unions
as {"<type>": value}, bytes as code points 0-255, timestamps and dates in RFC
3339), which ferry produce reads back; for Protobuf, protojson's mapping. A
value over large.message.consumer.poll.max.bytes is not decoded (an error).
With -X value.deserializers=bytes (no large-message stage) an offloaded
value is written as it was fetched, its reference, as kafka-console-consumer
shows it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.fromBeginningSet = cmd.Flags().Changed("from-beginning")
			return a.consume(cmd.Context(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.brokers, "brokers", "", "Kafka bootstrap servers, `HOST:PORT[,...]` (property bootstrap.servers)")
	fl.StringVarP(&f.topic, "topic", "t", "", "topic to consume (required)")
	fl.StringVar(&f.store, "store", "", "payload store `URL` or directory (property "+largemessage.KeyStoreURL+")")
	fl.StringVarP(&f.out, "out", "o", "", "write each value to a file in `DIR`, named as the file produce sent (else TOPIC-PARTITION-OFFSET), instead of standard output")
	fl.IntVarP(&f.n, "count", "n", 0, "stop after `N` records (0: no limit), records skipped by large.message.skip.not.found.error included, as Kafka's console consumer counts --max-messages")
	fl.BoolVar(&f.fromBeginning, "from-beginning", true, "start at the earliest offset of each partition (false: the latest); with --group, of each partition the group has no committed offset for (property auto.offset.reset)")
	fl.StringVarP(&f.group, "group", "g", "", "join consumer group `GROUP`, resume from its committed offsets and commit each record once written (property group.id)")
	fl.DurationVar(&f.idle, "timeout", defaultIdle, "stop when no record arrives for this `DURATION` (0: wait for ever)")
	return cmd
}

func (a *app) consume(ctx context.Context, f consumeFlags) error {
	if f.topic == "" {
		return usageErrorf("consume: --topic is required (see ferry consume --help)")
	}
	if f.n < 0 {
		return usageErrorf("consume: -n %d: must be 0 or more", f.n)
	}
	if f.idle < 0 {
		return usageErrorf("consume: --timeout %s: must be 0 or more", f.idle)
	}
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return usageErrorf("consume: --out: %v", err)
		}
	}
	s, err := a.loadSettings(f.brokers, f.store, true)
	if err != nil {
		return err
	}
	start, err := startOffset(s.props, f.fromBeginning, f.fromBeginningSet)
	if err != nil {
		return err
	}
	g, err := parseGroup(s.props, strings.TrimSpace(f.group), s.cfg.MaxPollInterval)
	if err != nil {
		return err
	}
	s.readOnly = true
	// Retriable fetch errors are kept (franz-go strips them) so that
	// CORRUPT_MESSAGE, which a ferry proxy answers for a record that will
	// never open, stops ferry as it stops Kafka's console consumer; the
	// others are retried as before (run).
	iso, err := isolationLevel(s.props)
	if err != nil {
		return err
	}
	opts := append([]kgo.Opt{kgo.ConsumeTopics(f.topic), kgo.ConsumeResetOffset(start), kgo.KeepRetryableFetchErrors(),
		kgo.FetchIsolationLevel(iso)}, g.opts...)
	store, cl, closeAll, err := s.open(ctx, opts...)
	if err != nil {
		return err
	}
	defer closeAll()
	if err := checkTopic(ctx, cl, f.topic); err != nil {
		return err
	}
	c := &consumer{
		cl:  cl,
		de:  s.cfg.NewDeserializer(store),
		out: f.out, stdout: a.stdout,
		commit: g.id != "" && g.commit,

		resolveValue: s.cfg.ValueDeserializers.LargeMessage(),
		next:         map[partitionOf]int64{},
	}
	if !s.cfg.ValueDeserializers.PassesBytes() {
		c.valueDe, c.decodeMax = s.cfg.ValueDeserializers, s.cfg.PollMaxBytes
	}
	err = c.run(ctx, f.n, f.idle)
	if g.id == "" {
		return err
	}
	cl.AllowRebalance()
	if cerr := c.commitWritten(g.id); cerr != nil {
		if err == nil {
			return cerr
		}
		slog.Warn(cerr.Error())
	}
	return err
}

// commitWritten commits the offsets of the records written (marked) and not
// yet committed, within closeTimeout: ctx may have ended (Ctrl-C), and what
// was written is committed all the same.
func (c *consumer) commitWritten(group string) error {
	if !c.commit || c.last == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := c.cl.CommitMarkedOffsets(ctx); err != nil {
		return fmt.Errorf("committing the offsets written to group %s (the last %s/%d@%d): %w; the records after the group's last committed offset will be read again",
			group, c.last.Topic, c.last.Partition, c.last.Offset, err)
	}
	slog.Info("committed", "group", group, "last", fmt.Sprintf("%s/%d@%d", c.last.Topic, c.last.Partition, c.last.Offset))
	return nil
}

type consumer struct {
	cl     *kgo.Client
	de     *largemessage.Deserializer
	out    string
	stdout io.Writer
	// commit: mark each record written (or skipped) for the group's
	// commits (kgo.AutoCommitMarks).
	commit bool

	// valueDe decodes values (value.deserializers other than bytes,
	// such as large-message,avro) up to decodeMax bytes each; nil: values
	// are written as they are.
	valueDe   *serde.Chain
	decodeMax int64
	// resolveValue: value.deserializers has the large-message stage, so an
	// offloaded value is written resolved (else as its reference).
	resolveValue bool

	last    *kgo.Record     // the last record written out
	partial bool            // a value was cut short on standard output
	written map[string]bool // the names written under out in this run (outputName)
	sealed  bool            // a record sealed by a proxy's encrypt was met (warned once)
	// next is the offset after the last record written, per partition,
	// for a fetch error's message.
	next map[partitionOf]int64
}

type partitionOf struct {
	topic     string
	partition int32
}

// stopped is the error of a consume interrupted (ctx ended) after done
// records, while cur (nil: none) was being written.
func (c *consumer) stopped(ctx context.Context, done int, cur *kgo.Record) error {
	msg := fmt.Sprintf("%v after %d record%s", context.Cause(ctx), done, map[bool]string{true: "s"}[done != 1])
	if c.last != nil {
		msg += fmt.Sprintf(" (the last %s/%d@%d)", c.last.Topic, c.last.Partition, c.last.Offset)
	}
	switch {
	case cur != nil && c.partial:
		msg += fmt.Sprintf("; the value of %s/%d@%d on standard output is incomplete", cur.Topic, cur.Partition, cur.Offset)
	case cur != nil:
		msg += fmt.Sprintf("; %s/%d@%d was not written", cur.Topic, cur.Partition, cur.Offset)
	}
	return fmt.Errorf("%s%w", msg, noText{context.Cause(ctx)})
}

// run consumes until max records (0: no limit) or until idle passes without
// a record (0: no limit).
func (c *consumer) run(ctx context.Context, max int, idle time.Duration) error {
	done := 0
	for max == 0 || done < max {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if idle > 0 {
			pctx, cancel = context.WithTimeout(ctx, idle)
		}
		want := 0
		if max > 0 {
			want = max - done
		}
		fs := c.cl.PollRecords(pctx, want)
		timedOut := pctx.Err() != nil
		cancel()
		if ctx.Err() != nil {
			return c.stopped(ctx, done, nil)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			var ke *kerr.Error
			if errors.As(err, &ke) && ke.Retriable && ke != kerr.CorruptMessage {
				return // franz-go retries it (KeepRetryableFetchErrors only shows it)
			}
			if ferr == nil && !(timedOut && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled))) {
				ferr = fmt.Errorf("fetching %s: %w", fetchWhere(t, p), err)
				if errors.Is(err, kerr.CorruptMessage) {
					at := ""
					if n, ok := c.next[partitionOf{t, p}]; ok {
						at = fmt.Sprintf(" at offset %d", n)
					}
					ferr = fmt.Errorf("fetching %s%s: %w (a ferry proxy answers it for a record that will never be readable: its log names the record and why)",
						fetchWhere(t, p), at, err)
				}
				if strings.Contains(err.Error(), "response exceeds BrokerMaxReadBytes") {
					// (franz-go's error is not exported; TestCLIConsumeReceiveMaxBytes checks the text.)
					ferr = fmt.Errorf("%w (a fetch response is larger than %s; a ferry proxy returns a resolved record whole in one response: raise it with -X %s=BYTES, at most 1073741824, and at least fetch.max.bytes)", ferr, keyReceiveMaxBytes, keyReceiveMaxBytes)
				}
			}
		})
		if ferr != nil {
			return ferr
		}
		recs := fs.Records()
		for _, r := range recs {
			if err := c.one(ctx, r); err != nil {
				if ctx.Err() != nil {
					return c.stopped(ctx, done, r)
				}
				return err
			}
			if c.commit {
				c.cl.MarkCommitRecords(r)
			}
			c.last = r
			c.next[partitionOf{r.Topic, r.Partition}] = r.Offset + 1
			done++
		}
		// The records polled are written: the group may rebalance
		// (kgo.BlockRebalanceOnPoll; a no-op without a group).
		c.cl.AllowRebalance()
		if len(recs) == 0 && timedOut {
			if max > 0 {
				slog.Warn(fmt.Sprintf("no new record for %s; stopping after %d of %d records", idle, done, max))
			} else if done == 0 {
				// Said at the default level: an empty topic (or a wrong
				// name) is not mistaken for success in silence.
				slog.Warn(fmt.Sprintf("no record arrived within --timeout %s; stopping with none", idle))
			} else {
				slog.Info("no new record; stopping", "timeout", idle, "records", done)
			}
			return nil
		}
	}
	return nil
}

// one resolves r's value as it streams and writes it out.
func (c *consumer) one(ctx context.Context, r *kgo.Record) error {
	if !c.sealed && hasHeader(r, interceptor.HeaderEncrypted) {
		// Written as it is (a backup may want the ciphertext), but the
		// reader should know: only a ferry proxy opens such records.
		c.sealed = true
		slog.Warn("a record sealed by a ferry proxy's encrypt interceptor (header "+interceptor.HeaderEncrypted+"): its value and sealed headers are written as ciphertext; consume through the proxy to read the plaintext (warned once per run)",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
	}
	// An offloaded key is resolved in memory (keys are small next to the
	// values this streams); it is shown in the record's line.
	err := c.de.ResolveKey(ctx, r)
	var rc io.ReadCloser
	if err == nil {
		rc, _, err = c.de.OpenValue(ctx, r)
	}
	if err != nil {
		var re *largemessage.RecordError
		if errors.As(err, &re) && re.Skipped {
			slog.Warn("skipped a record whose payload is missing", "err", re.Error())
			return nil
		}
		return err
	}
	defer rc.Close()
	// value.deserializers without large-message hands the reference out
	// as fetched (c.de.OpenValue): the value is written as it is.
	offloaded := largemessage.IsOffloaded(r) && c.resolveValue
	if c.valueDe != nil {
		if rc, err = c.decode(ctx, r, rc); err != nil {
			return err
		}
	}
	// A payload is read, verified (size, SHA-256) and written in one pass,
	// in ctxio.Copy's 64 KiB pieces; a long copy (a local file store)
	// stops with ctx. An inline value is written as it is.
	copyValue := func(dst io.Writer) (int64, error) {
		if !offloaded {
			return io.Copy(dst, rc)
		}
		return ctxio.Copy(ctx, dst, rc)
	}
	if c.out == "" {
		if n, err := copyValue(c.stdout); err != nil {
			c.partial = n > 0
			return c.recordErr(r, err)
		}
		return nil
	}
	if c.written == nil {
		c.written = map[string]bool{}
	}
	base := outputName(r, c.written)
	name := filepath.Join(c.out, base)
	tmp, err := os.CreateTemp(c.out, ".ferry-*")
	if err != nil {
		return err
	}
	n, err := copyValue(tmp)
	if err == nil {
		err = tmp.Chmod(0o644) // CreateTemp makes 0600; the output is an ordinary file
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), name)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return c.recordErr(r, err)
	}
	c.written[base] = true
	how := "inline"
	if offloaded {
		how = "offloaded"
	}
	key := "null" // no key, as kafka-console-consumer prints it
	if r.Key != nil {
		k := r.Key
		if len(k) > 64 {
			k = append(k[:64:64], "..."...)
		}
		key = strconv.Quote(string(k))
	}
	fmt.Fprintf(c.stdout, "%s/%d@%d %d bytes %s key=%s -> %s\n", r.Topic, r.Partition, r.Offset, n, how, key, name)
	return nil
}

// decode reads r's value from rc (at most decodeMax bytes), runs it
// through value.deserializers and returns it as one line of JSON
// (Avro close to Avro's JSON encoding, Protobuf in protojson's mapping;
// see consume --help).
func (c *consumer) decode(ctx context.Context, r *kgo.Record, rc io.Reader) (io.ReadCloser, error) {
	if r.Value == nil && !largemessage.IsOffloaded(r) {
		return io.NopCloser(strings.NewReader("null\n")), nil
	}
	b, err := io.ReadAll(io.LimitReader(rc, c.decodeMax+1))
	if err != nil {
		return nil, c.recordErr(r, err)
	}
	if int64(len(b)) > c.decodeMax {
		return nil, c.recordErr(r, fmt.Errorf("the value is over %d bytes (%s), the most value.deserializers %s decodes in memory", c.decodeMax, largemessage.KeyPollMaxBytes, c.valueDe))
	}
	v, err := c.valueDe.Deserialize(ctx, r.Topic, b)
	if err != nil {
		return nil, c.recordErr(r, fmt.Errorf("value.deserializers %s: %w", c.valueDe, err))
	}
	var out []byte
	if m, ok := v.(proto.Message); ok {
		out, err = protojson.Marshal(m)
	} else {
		out, err = json.Marshal(schemareg.AvroJSON(v))
	}
	if err != nil {
		return nil, c.recordErr(r, fmt.Errorf("value.deserializers %s: the decoded value as JSON: %w", c.valueDe, err))
	}
	return io.NopCloser(bytes.NewReader(append(out, '\n'))), nil
}

// recordErr names the record in err unless it already does (a
// *largemessage.RecordError from the verifying reader).
func (c *consumer) recordErr(r *kgo.Record, err error) error {
	var re *largemessage.RecordError
	if errors.As(err, &re) {
		return err
	}
	return fmt.Errorf("topic %s partition %d offset %d: %w", r.Topic, r.Partition, r.Offset, err)
}

// fetchWhere names what a fetch error is about: a topic's partition, or
// the fetch as a whole (franz-go reports errors of a whole response, such as
// one over receive.message.max.bytes, under topic "" and partition -1).
func fetchWhere(topic string, partition int32) string {
	if topic == "" {
		return "from the brokers"
	}
	return fmt.Sprintf("topic %s partition %d", topic, partition)
}

// hasHeader reports whether r carries a header named key.
func hasHeader(r *kgo.Record, key string) bool {
	for _, h := range r.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
