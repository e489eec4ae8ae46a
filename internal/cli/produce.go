package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/serde"
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
is given). The base name also travels in the header ferry.file.name, so that
ferry consume --out DIR restores the file under its name.

A file larger than the topic accepts inline (its max.message.bytes, the
client's max.request.size, large.message.threshold.bytes) is streamed: it is
hashed and uploaded to the payload store from disk, never held in memory, and
Kafka gets a small reference. Smaller inputs are decided exactly by the
large-message serializer. Standard input is read into memory up to that limit
and spooled to a temporary file beyond it.

--store (or large.message.payload.store.url) names the payload store, e.g.
file:///var/ferry or a directory path; it is needed only when a record must
be offloaded. It is a URL (s3://BUCKET/PREFIX, gs://, azblob://,
file:///DIR; not mem://, gone when ferry exits) or a directory path;
"s3:/bucket" or "file:dir" are
refused, not taken as folders. One line per record goes to standard output:
  TOPIC/PARTITION@OFFSET SIZE bytes inline
  TOPIC/PARTITION@OFFSET SIZE bytes offloaded FULL-PAYLOAD-PATH

When a record fails, the payload published for it is deleted (unless it is
named by its content and may be shared) and the error, one line on stderr,
says so and lists the inputs produced before it. Ctrl-C (SIGINT) or SIGTERM
stops ferry at once, even while the broker does not answer: exit 130 (143
for SIGTERM), with one line naming the inputs produced (and their offsets)
and what became of the interrupted record's payload: deleted, or kept when
its produce request was sent and not answered (the record may be in the
topic; ferry gc removes the payload if not).

With -X value.serializers=avro,large-message (or protobuf, json-schema) and
-X schema.registry.url=URL, each input is JSON, encoded under the latest
schema registered for the subject TOPIC-value (use.schema.id picks another)
in Confluent's wire format: for avro, Avro's JSON encoding (as
kafka-avro-console-producer reads it; also what ferry consume prints: a
union of null and one type as its plain value, RFC 3339 timestamps); for
protobuf, protojson's mapping of
the schema's first message; for json-schema, the JSON itself, checked
against the schema. Such an input is read into memory (at most 256 MiB).
Without large-message in value.serializers (avro alone), the encoded value
is produced inline, and one that does not fit the topic is refused before
it is sent; so is any input with value.serializers=bytes (never offloaded).`,
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
	snd, cl, closeAll, err := s.openSender(ctx, f.progress || isTerminal(a.stderr), a.stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	// value.serializers other than bytes (avro, protobuf, json-schema):
	// each input is JSON, encoded through the chain.
	encode := !s.cfg.ValueSerializers.PassesBytes()
	// value.serializers=bytes, without large-message: the value is never
	// offloaded (as the library's Producer and an avro chain alone do); an
	// input that does not fit the topic inline is refused before it is sent.
	inlineOnly := !encode && !s.cfg.ValueSerializers.LargeMessage()
	// Fail before producing anything when a file must be offloaded and no
	// store is set (an encoded input's size is known only once encoded).
	if !snd.hasStore && !encode && !inlineOnly {
		l, cut := snd.cutoff(ctx, f.topic)
		for _, in := range inputs {
			if st, err := os.Stat(in); in != "-" && err == nil && st.Size() > cut {
				return snd.needStore(in, st.Size(), f.topic, l)
			}
		}
	}
	// The topic is created only once nothing above refused the inputs: a
	// missing topic's limit is the broker's message.max.bytes, which is
	// what it is created with.
	if err := checkTopic(ctx, cl, f.topic); err != nil {
		if ctx.Err() != nil {
			return err
		}
		// As Kafka's console producer with auto.create.topics.enable:
		// a missing topic is created with the broker's defaults.
		cctx, cancel := context.WithTimeout(ctx, pingTimeout)
		resp, cerr := kadm.NewClient(cl).CreateTopic(cctx, -1, -1, nil, f.topic)
		cancel()
		if cerr == nil {
			cerr = resp.Err
		}
		if cerr != nil && !errors.Is(cerr, kerr.TopicAlreadyExists) {
			return fmt.Errorf("%v, and creating it failed: %w", err, cerr)
		}
		fmt.Fprintf(a.stderr, "ferry: created topic %s with the broker's default partitions and replication\n", f.topic)
	}
	var done []sent
	for _, in := range inputs {
		if ctx.Err() != nil {
			return produceStopped(ctx, inputs, done, nil)
		}
		key := []byte(f.key)
		var res sent
		var err error
		switch {
		case encode:
			if in == "-" && !f.keySet {
				key = nil
			} else if !f.keySet {
				key = []byte(filepath.Base(in))
			}
			var hs []kgo.RecordHeader
			if in != "-" {
				hs = fileNameHeaders(in) // ferry consume --out restores the name
			}
			var b []byte
			chain := s.cfg.ValueSerializers
			if b, err = encodeInput(ctx, chain, f.topic, in, a.stdin); err == nil {
				if chain.LargeMessage() {
					// The chain offloaded what had to be: b is a
					// reference or fits.
					res, err = snd.sendStdin(ctx, f.topic, in, key, bytes.NewReader(b), hs)
				} else {
					res, err = snd.sendInline(ctx, f.topic, in, chain.String(), key, b, hs)
				}
			}
		case inlineOnly:
			var hs []kgo.RecordHeader
			if in == "-" && !f.keySet {
				key = nil
			} else if in != "-" {
				if !f.keySet {
					key = []byte(filepath.Base(in))
				}
				hs = fileNameHeaders(in)
			}
			res, err = snd.sendInlineInput(ctx, f.topic, in, s.cfg.ValueSerializers.String(), key, a.stdin, hs)
		case in == "-":
			if !f.keySet {
				key = nil
			}
			res, err = snd.sendStdin(ctx, f.topic, "-", key, a.stdin, nil)
		default:
			if !f.keySet {
				key = []byte(filepath.Base(in))
			}
			res, err = snd.sendFile(ctx, f.topic, in, key, in)
		}
		if err != nil {
			return produceStopped(ctx, inputs, done, err)
		}
		done = append(done, res)
		fmt.Fprintln(a.stdout, res.line())
	}
	return nil
}

// maxEncodeInput bounds an input encoded through value.serializers: it is
// read into memory whole, as JSON.
const maxEncodeInput = 256 << 20

// encodeInput reads input in (a file, or standard input for "-") as JSON,
// at most maxEncodeInput bytes, and serializes it through chain for topic:
// for avro, JSON in Avro's JSON encoding (as kafka-avro-console-producer
// reads it); for protobuf, protojson's mapping of the schema's first
// message; for json-schema, the JSON itself, checked against the schema.
func encodeInput(ctx context.Context, chain *serde.Chain, topic, in string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if in != "-" {
		f, err := os.Open(in)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxEncodeInput+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", inputName(in), err)
	}
	if len(b) > maxEncodeInput {
		return nil, fmt.Errorf("%s: more than %d bytes: an input encoded through value.serializers %s is read into memory, at most that much", inputName(in), maxEncodeInput, chain)
	}
	b = bytes.TrimSpace(b)
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		return nil, fmt.Errorf("%s is not JSON (%v): with value.serializers %s each input is one JSON value", inputName(in), err, chain)
	}
	out, err := chain.Serialize(ctx, topic, json.RawMessage(b))
	if err != nil {
		return nil, fmt.Errorf("%s: value.serializers %s: %w", inputName(in), chain, err)
	}
	return out, nil
}

// produceStopped is the error of a produce that stopped, interrupted or
// failed, after the inputs in done were produced: what failed, what became
// of its payloads, and, with several inputs or when interrupted, which
// inputs were produced (at which offsets) and which were not.
func produceStopped(ctx context.Context, inputs []string, done []sent, err error) error {
	interrupted := ctx.Err() != nil
	var msg string
	switch {
	case interrupted && err == nil:
		msg = context.Cause(ctx).Error() + " before producing " + inputName(inputs[len(done)])
	case interrupted:
		msg = context.Cause(ctx).Error() + " while producing " + inputName(inputs[len(done)])
		var se *sendError
		if errors.As(err, &se) {
			for _, n := range se.notes {
				msg += "; " + n
			}
		}
	default:
		msg = err.Error()
	}
	if len(inputs) > 1 || interrupted {
		if len(done) == 0 {
			msg += "; nothing was produced"
		} else {
			var ps []string
			for _, d := range done {
				ps = append(ps, fmt.Sprintf("%s %s/%d@%d", inputName(d.Name), d.Topic, d.Partition, d.Offset))
			}
			msg += fmt.Sprintf("; produced %d of %d inputs: %s", len(done), len(inputs), listSome(ps))
			var ns []string
			for _, in := range inputs[len(done):] {
				ns = append(ns, inputName(in))
			}
			msg += "; not produced: " + listSome(ns)
		}
	}
	cause := err
	if interrupted {
		cause = context.Cause(ctx) // RunIO exits 130 on it
	}
	return fmt.Errorf("%s%w", msg, noText{cause})
}

// noText wraps an error for errors.Is and errors.As without adding to the
// message.
type noText struct{ err error }

func (noText) Error() string   { return "" }
func (n noText) Unwrap() error { return n.err }

// inputName is how an input is named in messages.
func inputName(in string) string {
	if in == "-" {
		return "standard input"
	}
	return in
}

// listSome joins up to ten items, then says how many more there are (the
// output lines list every produced input).
func listSome(items []string) string {
	const most = 10
	if len(items) <= most {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:most], ", "), len(items)-most)
}
