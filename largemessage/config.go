package largemessage

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/payloadstore"
	"github.com/ferrykit/ferry/serde"
)

// Config keys. The large.message.* names follow KIP-1159 (and its early
// revision for the store's retry settings) and KIP-917.
const (
	KeyThreshold         = "large.message.threshold.bytes"
	KeyStoreURL          = "large.message.payload.store.url"
	KeyIDGenerator       = "large.message.payload.id.generator"
	KeyStoreTimeout      = "large.message.payload.store.timeout.ms"
	KeyRetryCount        = "large.message.payload.store.retry.count"
	KeyRetryBackoff      = "large.message.payload.store.retry.backoff.ms"
	KeyRetryMaxBackoff   = "large.message.payload.store.retry.max.backoff.ms"
	KeyCustomMetadataMax = "large.message.payload.store.custom.metadata.max.bytes"
	KeySkipNotFound      = "large.message.skip.not.found.error"
	KeyPartSize          = "large.message.payload.store.part.size.bytes"
	KeyUploadConcurrency = "large.message.payload.store.upload.concurrency"
	// Downloads from the cloud stores: the size of each ranged GET and how
	// many are in flight (payloadstore.Options.DownloadPartBytes).
	KeyDownloadPartBytes   = "large.message.payload.store.download.part.bytes"
	KeyDownloadConcurrency = "large.message.payload.store.download.concurrency"
	// KeyPollMaxBytes bounds the resolved bytes one Consumer.PollRecords
	// returns (Consumer.WithPollMaxBytes).
	KeyPollMaxBytes = "large.message.consumer.poll.max.bytes"
	// KeyReferenceCopyTopics: a produced record may carry a reference into
	// the topics this pattern matches (a regular expression matching whole
	// topic names); Ferry copies the object into the record's own topic.
	// Library default ".*"; the proxy's default is none (its clients are
	// untrusted). docs/SECURITY.md.
	KeyReferenceCopyTopics = "large.message.reference.copy.topics"
	// KeyReferenceResolveTopics: a consumed record may reference objects of
	// the topics this pattern matches besides its own (data mirrored under
	// another topic name without Ferry). Default: none.
	KeyReferenceResolveTopics = "large.message.reference.resolve.topics"
	// Payload encryption (docs/OPERATIONS.md, docs/FORMAT.md §9): the
	// key-encryption key that wraps new data keys, a gocloud.dev/secrets
	// URL; older keys still read; how long (ms) and for how many payloads
	// one data key serves; whether objects that are not encrypted are read.
	KeyEncryptionKeyURL         = "large.message.payload.encryption.key.url"
	KeyEncryptionDecryptKeyURLs = "large.message.payload.encryption.decrypt.key.urls"
	KeyEncryptionDataKeyMaxAge  = "large.message.payload.encryption.data.key.max.age.ms"
	KeyEncryptionDataKeyMaxUses = "large.message.payload.encryption.data.key.max.uses"
	KeyEncryptionAllowPlaintext = "large.message.payload.encryption.allow.plaintext"
	KeyEncryptionCacheMax       = "large.message.payload.encryption.data.key.cache.max.entries"
	KeyMaxBlock                 = "max.block.ms"
	KeyMaxPollInterval          = "max.poll.interval.ms"
	KeyCompressionType          = "compression.type"
	defaultMaxBlock             = 60 * time.Second
	defaultMaxPollInterval      = 300 * time.Second
)

// Keys returns the large.message.* configuration keys Ferry knows.
func Keys() []string {
	return []string{KeyCustomMetadataMax, KeyIDGenerator, KeyPartSize, KeyRetryBackoff, KeyRetryCount,
		KeyRetryMaxBackoff, KeyStoreTimeout, KeyUploadConcurrency, KeyStoreURL, KeySkipNotFound, KeyThreshold,
		KeyReferenceCopyTopics, KeyReferenceResolveTopics, KeyEncryptionKeyURL, KeyEncryptionDecryptKeyURLs,
		KeyEncryptionDataKeyMaxAge, KeyEncryptionDataKeyMaxUses, KeyEncryptionAllowPlaintext, KeyEncryptionCacheMax,
		KeyDownloadPartBytes, KeyDownloadConcurrency, KeyPollMaxBytes}
}

// Config is the large-message Serializer/Deserializer configuration.
type Config struct {
	// StoreURL names the payload store (large.message.payload.store.url),
	// e.g. "file:///var/ferry" or "mem://test".
	StoreURL string
	// Threshold is large.message.threshold.bytes; 0 derives it from the
	// topic's max.message.bytes and the client's batch cap (see DeriveLimits).
	Threshold int64
	// IDGenerator names value objects (large.message.payload.id.generator:
	// "uuid", the default, or "sha256"). Keys always use the content id.
	IDGenerator payloadstore.IDGenerator
	// Policy is the store's retry and custom-metadata policy.
	Policy payloadstore.Policy
	// PartSizeBytes (large.message.payload.store.part.size.bytes, default
	// 8 MiB, at least 5 MiB) and UploadConcurrency
	// (large.message.payload.store.upload.concurrency, default 4) shape the
	// multipart uploads of the cloud stores; 0 means the default.
	PartSizeBytes, UploadConcurrency int
	// DownloadPartBytes (large.message.payload.store.download.part.bytes,
	// default 8 MiB, at least 256 KiB) and DownloadConcurrency
	// (large.message.payload.store.download.concurrency, default 8; 1 reads
	// with one GET) shape the ranged downloads of the cloud stores: one
	// download holds at most their product (64 MiB); 0 means the default.
	DownloadPartBytes, DownloadConcurrency int
	// DownloadBudget (no key) is charged for the ranged downloads' buffers
	// (payloadstore.Options.DownloadBudget); the proxy sets it.
	DownloadBudget payloadstore.Budget
	// PollMaxBytes (large.message.consumer.poll.max.bytes, default
	// DefaultPollMaxBytes, 50 MiB like fetch.max.bytes) bounds the resolved
	// key and value bytes one Consumer.PollRecords returns.
	PollMaxBytes int64
	// SkipNotFound is large.message.skip.not.found.error: a record whose
	// payload is missing is returned with a nil value and its error recorded
	// instead of failing the fetch.
	SkipNotFound bool
	// Codec is the producer's compression.type (and level).
	Codec Codec
	// Serde chains (package serde): key.serializers, value.serializers,
	// key.deserializers, value.deserializers. A serializer chain without
	// the large-message stage turns offloading off for that side.
	KeySerializers, ValueSerializers, KeyDeserializers, ValueDeserializers *serde.Chain
	// MaxBlock (max.block.ms) and MaxPollInterval (max.poll.interval.ms)
	// bound Policy.Timeout, as KIP-1159 requires.
	MaxBlock, MaxPollInterval time.Duration
	// CopyTopics (large.message.reference.copy.topics) matches the topics
	// whose objects a produced record may reference: the Serializer copies
	// such an object into the record's topic. nil: none (a reference into
	// another topic is refused with ErrWrongTopic). Default: every topic.
	CopyTopics *regexp.Regexp
	// ResolveTopics (large.message.reference.resolve.topics) matches the
	// topics whose objects a consumed record may reference besides its
	// own. nil (the default): none.
	ResolveTopics *regexp.Regexp
	// Encryption is the payload encryption's keyring configuration
	// (large.message.payload.encryption.key.url, .decrypt.key.urls,
	// .data.key.max.age.ms, default 3600000, .data.key.max.uses, default
	// 1000000, .data.key.cache.max.entries, default 1000: data keys held
	// for sealing, one per topic, and unwrapped ones held for opening).
	// No key URL at all: payloads are stored as they are.
	Encryption envelope.Config
	// AllowPlaintext (large.message.payload.encryption.allow.plaintext,
	// default false): with encryption on, objects that are not encrypted
	// (written before it was turned on) are still read.
	AllowPlaintext bool
}

// Encrypting reports whether payloads are encrypted (a key URL is set).
func (c Config) Encrypting() bool {
	return c.Encryption.KeyURL != "" || len(c.Encryption.DecryptKeyURLs) > 0
}

// TopicPattern compiles a pattern of large.message.reference.*.topics (or
// an interceptor's topic.pattern): a regular expression that must match a
// whole topic name, as Java's Pattern.matches() does. "" gives nil (no
// topic).
func TopicPattern(key, p string) (*regexp.Regexp, error) {
	if strings.TrimSpace(p) == "" {
		return nil, nil
	}
	re, err := regexp.Compile(`^(?:` + p + `)$`)
	if err != nil {
		return nil, fmt.Errorf("%s: %q is not a regular expression: %w", key, p, err)
	}
	return re, nil
}

// DefaultConfig is the configuration with every key at its default.
func DefaultConfig() Config {
	ser, _ := serde.ParseSerializers("bytes," + serde.LargeMessage)
	de, _ := serde.ParseDeserializers(serde.LargeMessage + ",bytes")
	return Config{
		KeySerializers: ser, ValueSerializers: ser, KeyDeserializers: de, ValueDeserializers: de,
		IDGenerator:     payloadstore.IDUUID{},
		CopyTopics:      regexp.MustCompile(`^(?:.*)$`),
		Policy:          payloadstore.DefaultPolicy,
		MaxBlock:        defaultMaxBlock,
		MaxPollInterval: defaultMaxPollInterval,
		PollMaxBytes:    DefaultPollMaxBytes,
	}
}

// ParseConfig reads a Config from Kafka-style properties. Unknown keys are
// ignored (they may be the client's). Errors name the key and the value.
func ParseConfig(props map[string]string) (Config, error) {
	c := DefaultConfig()
	c.StoreURL = strings.TrimSpace(props[KeyStoreURL])
	var err error
	intKey := func(key string, dst *int64) {
		v, ok := props[key]
		if !ok || err != nil {
			return
		}
		n, perr := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if perr != nil || n < 0 {
			err = fmt.Errorf("%s: %q is not a non-negative integer", key, v)
			return
		}
		*dst = n
	}
	msKey := func(key string, dst *time.Duration) {
		n := int64(-1)
		intKey(key, &n)
		if n >= 0 {
			*dst = time.Duration(n) * time.Millisecond
		}
	}
	intKey(KeyThreshold, &c.Threshold)
	msKey(KeyStoreTimeout, &c.Policy.Timeout)
	msKey(KeyRetryBackoff, &c.Policy.RetryBackoff)
	msKey(KeyRetryMaxBackoff, &c.Policy.RetryMaxBackoff)
	msKey(KeyMaxBlock, &c.MaxBlock)
	msKey(KeyMaxPollInterval, &c.MaxPollInterval)
	retries, metaMax := int64(c.Policy.RetryCount), int64(c.Policy.CustomMetadataMaxBytes)
	intKey(KeyRetryCount, &retries)
	intKey(KeyCustomMetadataMax, &metaMax)
	c.Policy.RetryCount, c.Policy.CustomMetadataMaxBytes = int(retries), int(metaMax)
	maxAge, maxUses := int64(envelope.DefaultDataKeyMaxAge/time.Millisecond), int64(envelope.DefaultDataKeyMaxUses)
	intKey(KeyEncryptionDataKeyMaxAge, &maxAge)
	intKey(KeyEncryptionDataKeyMaxUses, &maxUses)
	c.Encryption.DataKeyMaxAge, c.Encryption.DataKeyMaxUses = time.Duration(maxAge)*time.Millisecond, maxUses
	cacheMax := int64(envelope.DefaultCacheMaxEntries)
	intKey(KeyEncryptionCacheMax, &cacheMax)
	c.Encryption.CacheMaxEntries = int(cacheMax)
	c.Encryption.KeyURL = strings.TrimSpace(props[KeyEncryptionKeyURL])
	for _, u := range strings.Split(props[KeyEncryptionDecryptKeyURLs], ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.Encryption.DecryptKeyURLs = append(c.Encryption.DecryptKeyURLs, u)
		}
	}
	partSize, conc := int64(0), int64(0)
	intKey(KeyPartSize, &partSize)
	intKey(KeyUploadConcurrency, &conc)
	c.PartSizeBytes, c.UploadConcurrency = int(partSize), int(conc)
	dlPart, dlConc := int64(0), int64(0)
	intKey(KeyDownloadPartBytes, &dlPart)
	intKey(KeyDownloadConcurrency, &dlConc)
	c.DownloadPartBytes, c.DownloadConcurrency = int(dlPart), int(dlConc)
	intKey(KeyPollMaxBytes, &c.PollMaxBytes)
	if err == nil && c.PollMaxBytes == 0 {
		err = fmt.Errorf("%s: must be at least 1", KeyPollMaxBytes)
	}
	if err != nil {
		return c, err
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{{KeySkipNotFound, &c.SkipNotFound}, {KeyEncryptionAllowPlaintext, &c.AllowPlaintext}} {
		if v, ok := props[b.key]; ok {
			if *b.dst, err = strconv.ParseBool(strings.TrimSpace(v)); err != nil {
				return c, fmt.Errorf("%s: %q is not true or false", b.key, v)
			}
		}
	}
	for _, ch := range []struct {
		key       string
		dst       **serde.Chain
		de, isKey bool
	}{{"key.serializers", &c.KeySerializers, false, true}, {"value.serializers", &c.ValueSerializers, false, false},
		{"key.deserializers", &c.KeyDeserializers, true, true}, {"value.deserializers", &c.ValueDeserializers, true, false}} {
		v, ok := props[ch.key]
		if !ok {
			continue
		}
		parse := serde.ParseSerializersFor
		if ch.de {
			parse = serde.ParseDeserializersFor
		}
		if *ch.dst, err = parse(v, props, ch.isKey); err != nil {
			return c, fmt.Errorf("%s: %w", ch.key, err)
		}
	}
	for _, k := range []struct {
		key string
		dst **regexp.Regexp
	}{{KeyReferenceCopyTopics, &c.CopyTopics}, {KeyReferenceResolveTopics, &c.ResolveTopics}} {
		if v, ok := props[k.key]; ok {
			if *k.dst, err = TopicPattern(k.key, v); err != nil {
				return c, err
			}
		}
	}
	if c.IDGenerator, err = payloadstore.ParseIDGenerator(strings.TrimSpace(props[KeyIDGenerator])); err != nil {
		return c, err
	}
	if c.Codec, err = ParseCodec(props); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate checks the timing rule of KIP-1159: the store's total time,
// retries included, must fit within max.block.ms and max.poll.interval.ms.
func (c Config) Validate() error {
	if c.Policy.Timeout <= 0 {
		return fmt.Errorf("%s must be > 0", KeyStoreTimeout)
	}
	if c.MaxBlock > 0 && c.Policy.Timeout > c.MaxBlock {
		return fmt.Errorf("%s (%d) exceeds %s (%d): KIP-1159 requires the store's total time to stay within it",
			KeyStoreTimeout, c.Policy.Timeout.Milliseconds(), KeyMaxBlock, c.MaxBlock.Milliseconds())
	}
	if c.AllowPlaintext && !c.Encrypting() {
		return fmt.Errorf("%s has no effect without %s", KeyEncryptionAllowPlaintext, KeyEncryptionKeyURL)
	}
	if c.Encrypting() && (c.Encryption.DataKeyMaxAge <= 0 || c.Encryption.DataKeyMaxUses <= 0 || c.Encryption.CacheMaxEntries <= 0) {
		return fmt.Errorf("%s, %s and %s must be > 0", KeyEncryptionDataKeyMaxAge, KeyEncryptionDataKeyMaxUses, KeyEncryptionCacheMax)
	}
	if c.MaxPollInterval > 0 && c.Policy.Timeout > c.MaxPollInterval {
		return fmt.Errorf("%s (%d) exceeds %s (%d): KIP-1159 requires the store's total time to stay within it",
			KeyStoreTimeout, c.Policy.Timeout.Milliseconds(), KeyMaxPollInterval, c.MaxPollInterval.Milliseconds())
	}
	return nil
}

// NewDeserializer returns a Deserializer over store with c's
// large.message.skip.not.found.error and
// large.message.reference.resolve.topics, resolving the sides whose
// key.deserializers and value.deserializers have the large-message stage.
func (c Config) NewDeserializer(store payloadstore.PayloadStore) *Deserializer {
	return NewDeserializer(store, c.SkipNotFound).WithResolveTopics(c.ResolveTopics).WithDeserializers(c.KeyDeserializers, c.ValueDeserializers)
}

// OpenStore opens c.StoreURL with c's id generator and wraps it with c's
// retry and custom-metadata policy.
func (c Config) OpenStore(ctx context.Context) (payloadstore.PayloadStore, error) {
	return c.openStore(ctx, false)
}

// ErrNoStore is OpenStore's and OpenStoreForReading's error when
// KeyStoreURL is not set.
var ErrNoStore = errors.New(KeyStoreURL + " is not set")

// OpenStoreForReading is OpenStore for a consumer: the store must exist
// already (payloadstore.Options.ReadOnly).
func (c Config) OpenStoreForReading(ctx context.Context) (payloadstore.PayloadStore, error) {
	return c.openStore(ctx, true)
}

func (c Config) openStore(ctx context.Context, readOnly bool) (payloadstore.PayloadStore, error) {
	if c.StoreURL == "" {
		return nil, fmt.Errorf("%w: name a payload store, e.g. file:///var/ferry", ErrNoStore)
	}
	s, err := payloadstore.Open(ctx, c.StoreURL, payloadstore.Options{IDGenerator: c.IDGenerator, ReadOnly: readOnly,
		PartSizeBytes: c.PartSizeBytes, UploadConcurrency: c.UploadConcurrency,
		DownloadPartBytes: c.DownloadPartBytes, DownloadConcurrency: c.DownloadConcurrency, DownloadBudget: c.DownloadBudget,
		OpenTimeout: c.Policy.Timeout})
	if err != nil {
		return nil, err
	}
	if c.Encrypting() {
		k, err := envelope.OpenKeyring(ctx, c.Encryption)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("%s: %w", KeyEncryptionKeyURL, err)
		}
		s = payloadstore.Encrypted(s, payloadstore.Encryption{Keyring: k, AllowPlaintext: c.AllowPlaintext, IDGenerator: c.IDGenerator})
	}
	return payloadstore.Wrap(s, c.Policy), nil
}
