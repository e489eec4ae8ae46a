package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/internal/kafkaconf"
	"github.com/ferrykit/ferry/internal/props"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// Property keys the command maps onto franz-go options (the large.message.*
// keys, compression.type and its levels are largemessage.ParseConfig's).
const (
	keyBootstrap      = "bootstrap.servers"
	keyClientID       = "client.id"
	keyMaxRequestSize = "max.request.size"
	// Consumer sizes: Java's fetch.max.bytes and max.partition.fetch.bytes
	// (franz-go's FetchMaxBytes, FetchMaxPartitionBytes: 50 MiB and 1 MiB
	// by default), and librdkafka's receive.message.max.bytes, the largest
	// response read from a broker (franz-go's BrokerMaxReadBytes, 100 MiB by
	// default). A record resolved by a ferry proxy comes back whole in one
	// response, so a consumer of records over 100 MiB through the proxy
	// raises receive.message.max.bytes, as a librdkafka consumer does.
	keyFetchMaxBytes          = "fetch.max.bytes"
	keyMaxPartitionFetchBytes = "max.partition.fetch.bytes"
	keyReceiveMaxBytes        = "receive.message.max.bytes"
	// keyDeliveryTimeout is the Java producer's bound on a record's time
	// from send to acknowledgement, retries included (franz-go's
	// RecordDeliveryTimeout, unbounded by default: a retriable error, such
	// as a proxy's KAFKA_STORAGE_ERROR while its KMS is unreachable, was
	// retried for ever, in silence).
	keyDeliveryTimeout = "delivery.timeout.ms"
)

// defaultDeliveryTimeout is delivery.timeout.ms when unset: the Java
// producer's default.
const defaultDeliveryTimeout = 120 * time.Second

// pingTimeout bounds the start-up check that Kafka answers.
const pingTimeout = 10 * time.Second

// settings are the properties after the command's flags were applied.
type settings struct {
	props   map[string]string
	brokers []string
	cfg     largemessage.Config
	// sec is security.protocol with its ssl.* and sasl.* keys (kafkaconf).
	sec *kafkaconf.Security
	// readOnly: the command only consumes; the store must exist.
	readOnly bool
}

// loadSettings loads --config/-X, applies --brokers and --store over
// bootstrap.servers and large.message.payload.store.url, and parses the
// large-message configuration. Errors are usage errors.
func (a *app) loadSettings(brokersFlag, storeFlag string, needBrokers bool) (*settings, error) {
	p, err := a.props()
	if err != nil {
		return nil, err
	}
	if brokersFlag != "" {
		p[keyBootstrap] = brokersFlag
	}
	if err := a.applyStoreURL(p, storeFlag); err != nil {
		return nil, err
	}
	if err := refuseMemStore(p[largemessage.KeyStoreURL]); err != nil {
		return nil, err
	}
	s := &settings{props: p}
	if err := warnIgnored(p); err != nil {
		return nil, err
	}
	for _, b := range strings.Split(p[keyBootstrap], ",") {
		if b = strings.TrimSpace(b); b != "" {
			s.brokers = append(s.brokers, b)
		}
	}
	if needBrokers && len(s.brokers) == 0 {
		return nil, usageErrorf("--brokers (or the property %s) is required", keyBootstrap)
	}
	if s.cfg, err = largemessage.ParseConfig(p); err != nil {
		return nil, &usageError{err: err}
	}
	if s.sec, err = kafkaconf.Parse(p); err != nil {
		return nil, &usageError{err: err}
	}
	return s, nil
}

// warnIgnored warns about properties ferry does not apply, so that a
// setting such as ssl.cipher.suites is not dropped silently (the security
// keys kafkaconf reads are applied, or refused with an error); a key that
// looks like a misspelling of one it reads (keys.go) is a usage error.
func warnIgnored(p map[string]string) error {
	known := clientKeys()
	for _, k := range props.Keys(p) {
		switch {
		case slices.Contains(known, k),
			strings.HasPrefix(k, "compression.") && strings.HasSuffix(k, ".level"):
		case slices.Contains(kafkaKeysNearOurs, k) && isChain(p[k]):
			return usageErrorf("property %s=%s: %s names the Java client's class; ferry's chain of stages is %ss", k, p[k], k, k)
		case misspelledKey(k, known) != nil:
			return misspelledKey(k, known)
		case strings.HasPrefix(k, "large.message."):
			// Ferry's own namespace: an unknown key there is a typo.
			return usageErrorf("unknown property %s (the large.message.* keys are: %s)", k, strings.Join(largemessage.Keys(), ", "))
		default:
			if known, ok := kafkaconf.Misspelled(k); ok {
				return usageErrorf("unknown property %s (did you mean %s? a misspelled security key would leave the connection without the TLS or SASL it asks for)", k, known)
			}
			slog.Warn("property not supported by ferry; ignored", "key", k)
		}
	}
	return nil
}

// applyStoreURL parses the store URL strictly (parseStoreURL): --store
// when given, else large.message.payload.store.url from -X or --config, and
// sets the property to the result. Errors are usage errors naming where the
// URL came from.
func (a *app) applyStoreURL(p map[string]string, storeFlag string) error {
	raw := storeFlag
	if raw == "" {
		var ok bool
		if raw, ok = p[largemessage.KeyStoreURL]; !ok {
			return nil
		}
	}
	u, err := parseStoreURL(raw)
	if err != nil {
		if storeFlag != "" {
			return usageErrorf("--store %q: %v", shownStoreURL(raw), err)
		}
		return usageErrorf("%s: %v", a.propertySetting(largemessage.KeyStoreURL, shownStoreURL(raw)), err)
	}
	p[largemessage.KeyStoreURL] = u
	return nil
}

// propertySetting shows the property key set to value, and where: -X
// key="value", or key="value" in FILE (--config).
func (a *app) propertySetting(key, value string) string {
	for _, o := range a.overrides {
		if k, _, err := props.ParseOverride(o); err == nil && k == key {
			return fmt.Sprintf("-X %s=%q", key, value)
		}
	}
	return fmt.Sprintf("%s=%q in %s", key, value, a.configFile)
}

// clientOpts maps the properties onto franz-go options.
func (s *settings) clientOpts() ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(s.brokers...),
		kgo.WithLogger(slogLogger{}),
	}
	if s.sec != nil {
		opts = append(opts, s.sec.Opts()...)
	}
	if id := strings.TrimSpace(s.props[keyClientID]); id != "" {
		opts = append(opts, kgo.ClientID(id))
	}
	if v, ok := s.props[keyMaxRequestSize]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil || n <= 0 {
			return nil, usageErrorf("%s: %q is not a positive 32-bit integer", keyMaxRequestSize, v)
		}
		opts = append(opts, kgo.ProducerBatchMaxBytes(int32(n)))
	}
	for _, o := range []struct {
		key string
		opt func(int32) kgo.Opt
	}{
		{keyFetchMaxBytes, func(n int32) kgo.Opt { return kgo.FetchMaxBytes(n) }},
		{keyMaxPartitionFetchBytes, func(n int32) kgo.Opt { return kgo.FetchMaxPartitionBytes(n) }},
		{keyReceiveMaxBytes, kgo.BrokerMaxReadBytes},
	} {
		if v, ok := s.props[o.key]; ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil || n <= 0 {
				return nil, usageErrorf("%s: %q is not a positive 32-bit integer", o.key, v)
			}
			opts = append(opts, o.opt(int32(n)))
		}
	}
	delivery, err := s.deliveryTimeout()
	if err != nil {
		return nil, err
	}
	opts = append(opts, kgo.RecordDeliveryTimeout(delivery))
	if s.cfg.Codec.Type == "none" || s.cfg.Codec.Type == "" {
		opts = append(opts, kgo.ProducerBatchCompression(kgo.NoCompression()))
	} else {
		opts = append(opts, kgo.ProducerBatchCompression(s.cfg.Codec.KgoCodec()))
	}
	return opts, nil
}

// deliveryTimeout is delivery.timeout.ms (defaultDeliveryTimeout when
// unset); a value that is not a positive number of ms is a usage error.
func (s *settings) deliveryTimeout() (time.Duration, error) {
	v, ok := s.props[keyDeliveryTimeout]
	if !ok {
		return defaultDeliveryTimeout, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err != nil || n <= 0 {
		return 0, usageErrorf("%s: %q is not a positive number of milliseconds", keyDeliveryTimeout, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// connect makes a client and checks that Kafka answers within pingTimeout.
func (s *settings) connect(ctx context.Context, extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := s.clientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		return nil, &usageError{err: fmt.Errorf("kafka client: %w", err)}
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		cl.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connecting to Kafka at %s: %w", strings.Join(s.brokers, ","), context.Cause(ctx))
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", pingTimeout)
		}
		if errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.IllegalSaslState) || errors.Is(err, kerr.UnsupportedSaslMechanism) {
			return nil, fmt.Errorf("login refused by Kafka at %s (%s): %w", strings.Join(s.brokers, ","), s.sec, err)
		}
		return nil, fmt.Errorf("cannot reach Kafka at %s%s: %w", strings.Join(s.brokers, ","), s.secNote(), err)
	}
	return cl, nil
}

// secNote is " (SASL_SSL (SCRAM-SHA-256 as alice))" for messages, "" for
// PLAINTEXT.
func (s *settings) secNote() string {
	if s.sec == nil || s.sec.Protocol == kafkaconf.Plaintext {
		return ""
	}
	return " (" + s.sec.String() + ")"
}

// checkTopic fails clearly when topic does not exist.
func checkTopic(ctx context.Context, cl *kgo.Client, topic string) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	tds, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("topic %s: reading metadata: %w", topic, err)
	}
	td, ok := tds[topic]
	switch {
	case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		return fmt.Errorf("topic %s does not exist", topic)
	case td.Err != nil:
		return fmt.Errorf("topic %s: %w", topic, td.Err)
	}
	return nil
}

// open opens the payload store and connects to Kafka (with extra client
// options); close releases both. It is the set-up every command shares.
func (s *settings) open(ctx context.Context, extra ...kgo.Opt) (payloadstore.PayloadStore, *kgo.Client, func(), error) {
	store, err := s.openStore(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	cl, err := s.connect(ctx, extra...)
	if err != nil {
		store.Close()
		return nil, nil, nil, err
	}
	return store, cl, func() {
		closeWithin(cl.Close, "the Kafka client")
		closeWithin(func() { store.Close() }, "the payload store")
	}, nil
}

// closeTimeout bounds closing the Kafka client or the store at the end of a
// command, so that an unanswered request cannot hold the command up.
const closeTimeout = 5 * time.Second

// closeWithin runs close, waiting for it at most closeTimeout.
func closeWithin(close func(), what string) {
	done := make(chan struct{}, 1)
	go func() {
		defer func() { done <- struct{}{} }()
		close()
	}()
	select {
	case <-done:
	case <-time.After(closeTimeout):
		slog.Warn("did not close in time; exiting without waiting", "what", what, "waited", closeTimeout)
	}
}

// openStore opens the configured payload store, or returns a stand-in that
// fails every operation with errNoStore when none is configured (so small
// records can be produced and inline records consumed without one).
func (s *settings) openStore(ctx context.Context) (payloadstore.PayloadStore, error) {
	if s.cfg.StoreURL == "" {
		return noStore{}, nil
	}
	open := s.cfg.OpenStore
	if s.readOnly {
		open = s.cfg.OpenStoreForReading
	}
	st, err := open(ctx)
	if err != nil {
		err = fmt.Errorf("cannot open payload store %s: %w", redactURL(s.cfg.StoreURL), err)
		if errors.Is(err, payloadstore.ErrInvalidConfig) || errors.Is(err, payloadstore.ErrUnknownScheme) || errors.Is(err, envelope.ErrKeyURL) {
			return nil, &usageError{err: err} // exit 2: fix the configuration
		}
		return nil, err
	}
	return st, nil
}

func redactURL(raw string) string { return payloadstore.RedactURL(raw) }

// errNoStore: a record had to go through the payload store but none is set.
// A configuration error, so exit 2 (a *usageError anywhere in the chain).
// refuseMemStore refuses a mem:// store URL (a usage error): the store
// lives in ferry's own memory, so a record produced with it would
// reference a payload gone when ferry exits (and, behind a proxy, one
// that the proxy's other replicas never had).
func refuseMemStore(u string) error {
	if !strings.HasPrefix(strings.ToLower(u), "mem://") {
		return nil
	}
	return usageErrorf("payload store %s lives in this process's memory and is gone when ferry exits (for the Go library and tests): "+
		"use one that outlives it, a directory or file:///DIR, s3://, gs:// or azblob://", u)
}

var errNoStore error = &usageError{err: errors.New("no payload store is set: use --store URL or -X " + largemessage.KeyStoreURL + "=URL (e.g. file:///var/ferry)")}

// noStore is the PayloadStore used when none is configured.
type noStore struct{}

func (noStore) Publish(_ context.Context, topic string, _ payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	return payloadstore.PayloadResponse{}, &payloadstore.Error{Op: "publish", Path: topic, Err: errNoStore}
}
func (noStore) Download(_ context.Context, fullPath string) (io.ReadCloser, error) {
	return nil, &payloadstore.Error{Op: "download", Path: fullPath, Err: errNoStore}
}
func (noStore) Delete(context.Context, string) error { return errNoStore }
func (noStore) ID(payloadstore.Payload) string       { return "" }
func (noStore) Class() string                        { return "ferry.cli.NoStore" }
func (noStore) Close() error                         { return nil }

// slogLogger sends franz-go's logs to slog. franz-go logs a failed dial as
// a warning, so its messages are only shown from --log-level info down: the
// command reports failures itself, in one line.
type slogLogger struct{}

func (slogLogger) Level() kgo.LogLevel {
	ctx := context.Background()
	switch h := slog.Default().Handler(); {
	case h.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelDebug
	case h.Enabled(ctx, slog.LevelInfo):
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelNone
}

func (slogLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	case kgo.LogLevelInfo:
		lvl = slog.LevelInfo
	}
	slog.Log(context.Background(), lvl, "kafka: "+msg, keyvals...)
}

// recordBytes is what a record occupies in Kafka as stored: key, value and
// header keys and values.
func recordBytes(r *kgo.Record) int64 {
	n := int64(len(r.Key) + len(r.Value))
	for _, h := range r.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// keyReferencePath returns the full payload path of an offloaded record's
// key.
func keyReferencePath(r *kgo.Record) string {
	if !largemessage.IsKeyOffloaded(r) {
		return ""
	}
	ref, err := largemessage.DecodeReference(r.Key)
	if err != nil {
		return ""
	}
	return ref.FullPayloadPath
}

// referencePath returns the full payload path of an offloaded record's value.
func referencePath(r *kgo.Record) string {
	if !largemessage.IsOffloaded(r) {
		return ""
	}
	ref, err := largemessage.DecodeReference(r.Value)
	if err != nil {
		return ""
	}
	return ref.FullPayloadPath
}
