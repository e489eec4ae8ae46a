package interceptor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferrykit/ferry/envelope"
)

// Configuration keys of encrypt (envelope.Config's fields).
const (
	// KeyEncryptKeyURL is the gocloud.dev/secrets URL of the key-encryption
	// key that wraps new data keys (awskms://, gcpkms://,
	// azurekeyvault://, hashivault://, base64key://). Required when the
	// interceptor runs on produce. A base64key:// URL holds the key itself:
	// it is never shown in errors or logs.
	KeyEncryptKeyURL = "encrypt.key.url"
	// KeyEncryptDecryptKeyURLs lists older key URLs, comma-separated, whose
	// records stay readable on fetch (key rotation). The current key is
	// always usable for decryption.
	KeyEncryptDecryptKeyURLs = "encrypt.decrypt.key.urls"
	// KeyEncryptHeaders lists header names, comma-separated, whose values
	// are encrypted too (every header of that name; null values stay null).
	KeyEncryptHeaders = "encrypt.headers"
	// KeyEncryptDataKeyMaxAge bounds, in ms, how long one data key seals
	// new records of a topic and how long an unwrapped data key is cached
	// (default 3600000).
	KeyEncryptDataKeyMaxAge = "encrypt.data.key.max.age.ms"
	// KeyEncryptDataKeyMaxUses bounds how many records (values and headers
	// each count) one data key seals (default 1000000).
	KeyEncryptDataKeyMaxUses = "encrypt.data.key.max.uses"
	// KeyEncryptDataKeyCacheMaxEntries bounds the data keys held per
	// direction: sealing (one per topic) and opening (one per wrapped key
	// seen) (default 1000).
	KeyEncryptDataKeyCacheMaxEntries = "encrypt.data.key.cache.max.entries"
)

// encryptKeys are the keys encrypt reads (for Keys).
var encryptKeys = []string{KeyEncryptKeyURL, KeyEncryptDecryptKeyURLs, KeyEncryptHeaders,
	KeyEncryptDataKeyMaxAge, KeyEncryptDataKeyMaxUses, KeyEncryptDataKeyCacheMaxEntries}

// HeaderEncrypted marks a record the encrypt interceptor sealed. Its value
// lists what was sealed, comma-separated, in the order sealed: "value"
// and/or "header:" and a header's name (every header of that name was
// sealed), e.g. "value" or "value,header:email". A record with nothing to
// seal (null value, no configured header with a value) gets no marker. On
// fetch only records with the marker are opened, and the marker is
// removed. A producer may not set it (INVALID_RECORD).
const HeaderEncrypted = "ferry.encrypted"

// Fields of a record the marker names, and their AAD Field
// (envelope.RecordAAD): the value is "value", a header "header:<name>".
const (
	encryptFieldValue  = "value"
	encryptFieldHeader = "header:"
)

// markerValue is the marker of a record whose value alone was sealed: the
// common case, shared (read only) instead of made per record.
var markerValue = []byte(encryptFieldValue)

// DecryptError is a fetched record the encrypt interceptor could not open:
// its marker does not parse, a field it names is absent, null or not
// sealed, or a sealed field does not open (Err wraps envelope's
// ErrAuthentication, ErrUnknownKey, ErrFormat, ErrNotSealed or ErrKMS). The
// chain fails the record's partition with KAFKA_STORAGE_ERROR, as
// large-message does for a reference it cannot resolve: the record is never
// passed on sealed or half-opened.
type DecryptError struct {
	Topic     string
	Partition int32
	Offset    int64
	// Field is "value", "header:<name>", or the marker header's name when
	// the marker itself is at fault.
	Field string
	Err   error
}

func (e *DecryptError) Error() string {
	return fmt.Sprintf("sealed record at topic %s partition %d offset %d: cannot open %s: %v", e.Topic, e.Partition, e.Offset, e.Field, e.Err)
}

func (e *DecryptError) Unwrap() error { return e.Err }

func init() { Register("encrypt", newEncrypt) }

// Encrypt is the encrypt interceptor: on produce it seals the value (and
// the configured headers) of each record of a matching topic with the
// topic's current data key, wrapped by the KMS key of encrypt.key.url
// (envelope.Keyring.SealRecord, AES-256-GCM bound to the topic and the
// field), and marks the record with HeaderEncrypted; on fetch it opens the
// records that carry the marker and removes it. Clients that read the
// broker directly see the sealed bytes (docs/FORMAT.md §9.3).
//
// Errors: on produce a KMS failure is KAFKA_STORAGE_ERROR (retriable;
// nothing is appended), a record carrying HeaderEncrypted already
// INVALID_RECORD; on fetch a record that does not open is a *DecryptError
// (the partition fails with KAFKA_STORAGE_ERROR).
type Encrypt struct {
	pattern *regexp.Regexp
	kr      *envelope.Keyring
	headers []string // header names sealed besides the value
	// ctxBound: every key's KMS client ends its calls when their ctx
	// ends, so a record's call returns soon after the time budget runs
	// out and a small partition may run on the request's goroutine
	// (inliner). gocloud.dev's hashivault keeper does not pass ctx to
	// Vault: with a hashivault:// key a call may outlive the budget.
	ctxBound bool
	// wrapped is the length of the last wrapped data key sealed with, to
	// size a sealed field's buffer (and its memory charge) before sealing.
	wrapped atomic.Int64
}

// newEncrypt reads topic.pattern, side (default both) and the encrypt.*
// keys and opens the keyring (a KMS connection per key URL, no KMS call).
// encrypt.key.url is required when side includes produce; on fetch alone
// the decryption keys may stand without it. Errors name the key, never a
// key URL's secret part.
func newEncrypt(ctx context.Context, config map[string]string) (Instance, error) {
	re, err := CompileTopicPattern(config[KeyTopicPattern])
	if err != nil {
		return Instance{}, err
	}
	p, f, err := sides(config, "both")
	if err != nil {
		return Instance{}, err
	}
	cfg := envelope.Config{KeyURL: strings.TrimSpace(config[KeyEncryptKeyURL]), DecryptKeyURLs: commaList(config[KeyEncryptDecryptKeyURLs])}
	if p && cfg.KeyURL == "" {
		return Instance{}, fmt.Errorf("%s is required to encrypt on produce (a gocloud.dev/secrets URL: awskms://, gcpkms://, azurekeyvault://, hashivault://, base64key://)", KeyEncryptKeyURL)
	}
	if cfg.KeyURL == "" && len(cfg.DecryptKeyURLs) == 0 {
		return Instance{}, fmt.Errorf("set %s or %s: no key to decrypt with", KeyEncryptKeyURL, KeyEncryptDecryptKeyURLs)
	}
	ms, err := positiveInt(config, KeyEncryptDataKeyMaxAge, envelope.DefaultDataKeyMaxAge.Milliseconds())
	if err != nil {
		return Instance{}, err
	}
	cfg.DataKeyMaxAge = time.Duration(ms) * time.Millisecond
	if cfg.DataKeyMaxUses, err = positiveInt(config, KeyEncryptDataKeyMaxUses, envelope.DefaultDataKeyMaxUses); err != nil {
		return Instance{}, err
	}
	entries, err := positiveInt(config, KeyEncryptDataKeyCacheMaxEntries, envelope.DefaultCacheMaxEntries)
	if err != nil {
		return Instance{}, err
	}
	cfg.CacheMaxEntries = int(min(entries, 1<<20))
	var headers []string
	for _, h := range commaList(config[KeyEncryptHeaders]) {
		if h == HeaderEncrypted {
			return Instance{}, fmt.Errorf("%s: %s is the interceptor's own marker", KeyEncryptHeaders, HeaderEncrypted)
		}
		if !slices.Contains(headers, h) {
			headers = append(headers, h)
		}
	}
	kr, err := envelope.OpenKeyring(ctx, cfg)
	if err != nil {
		return Instance{}, fmt.Errorf("%s / %s: %w", KeyEncryptKeyURL, KeyEncryptDecryptKeyURLs, err)
	}
	e := &Encrypt{pattern: re, kr: kr, headers: headers, ctxBound: !slices.ContainsFunc(append([]string{cfg.KeyURL}, cfg.DecryptKeyURLs...), isVaultURL)}
	in := Instance{Close: kr.Close}
	if p {
		in.Produce = e
	}
	if f {
		in.Fetch = encryptFetch{e}
	}
	return in, nil
}

// commaList splits a comma-separated list, trimming spaces and dropping
// empty items.
func commaList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// positiveInt reads key as a positive integer (def when unset).
func positiveInt(config map[string]string, key string, def int64) (int64, error) {
	v := strings.TrimSpace(config[key])
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive integer", key, config[key])
	}
	return n, nil
}

func (e *Encrypt) Name() string                 { return "encrypt" }
func (e *Encrypt) inline() bool                 { return e.ctxBound }
func (e *Encrypt) TopicPattern() *regexp.Regexp { return e.pattern }

// isVaultURL reports whether u is a hashivault:// key URL.
func isVaultURL(u string) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(u)), "hashivault://")
}

// sealsHeader reports whether headers named name are sealed.
func (e *Encrypt) sealsHeader(name string) bool { return slices.Contains(e.headers, name) }

// sealedSize is the size of a sealed field of plain bytes, with the last
// wrapped key's length (exact while the data key's KMS keeps its length),
// or before the first seal the longest a wrapped key may be
// (envelope.MaxWrappedKeyBytes): the buffer charged is never short, so no
// output is allocated before it is charged (found by a helper: the first
// sealed record after start was, guessed with a wrapped key of 0 bytes).
func (e *Encrypt) sealedSize(plain int) int {
	w := int(e.wrapped.Load())
	if w == 0 {
		w = envelope.MaxWrappedKeyBytes
	}
	return envelope.SealedRecordSize(plain, w)
}

// ProcessRecord seals r's value (unless null) and the values of the
// configured headers (unless null) with the topic's data key, and appends
// the HeaderEncrypted marker listing them. Each field is sealed straight
// into the batch's pooled buffer (Record.buffer), charged to the chain's
// budget before it is written: no allocation per record. A record that
// already carries the marker is refused (INVALID_RECORD): a marker only the
// proxy sets can be trusted on fetch. A KMS failure (a new data key is due:
// at most every encrypt.data.key.max.uses records or
// encrypt.data.key.max.age.ms per topic) is KAFKA_STORAGE_ERROR.
func (e *Encrypt) ProcessRecord(ctx context.Context, r *Record) error {
	sealHeaders := 0
	for _, h := range r.Headers {
		if h.Key == HeaderEncrypted {
			return fmt.Errorf("%w: the record carries the header %s, which only the proxy's encrypt interceptor sets (a record read from the broker directly and produced again is still sealed)", kerr.InvalidRecord, HeaderEncrypted)
		}
		if h.Value != nil && len(e.headers) > 0 && e.sealsHeader(h.Key) {
			sealHeaders++
		}
	}
	if r.Value == nil && sealHeaders == 0 {
		return nil // a tombstone, nothing to seal: no marker either
	}
	seal := func(plain []byte, field string) ([]byte, error) {
		buf, err := r.buffer(ctx, e.sealedSize(len(plain)))
		if err != nil {
			return nil, err
		}
		out, err := e.kr.SealRecord(ctx, buf[:0], plain, envelope.RecordAAD{Topic: r.Topic, Field: field})
		if err != nil {
			if errors.Is(err, envelope.ErrKMS) {
				return nil, fmt.Errorf("%w: %w", kerr.KafkaStorageError, err)
			}
			return nil, err
		}
		if w := int64(len(out) - envelope.SealedRecordSize(len(plain), 0)); w != e.wrapped.Load() {
			e.wrapped.Store(w)
		}
		if len(out) > len(buf) {
			// The topic's first wrapped key, longer than guessed: sealed
			// into a slice of its own, charged now.
			if err := r.Reserve(ctx, int64(len(out))); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	value := r.Value
	if value != nil {
		var err error
		if value, err = seal(value, encryptFieldValue); err != nil {
			return err
		}
	}
	marker := markerValue
	if sealHeaders > 0 {
		// The headers' values are sealed in place (r.Headers is the
		// record's own copy); the marker is built on the stack and
		// copied once into the batch's buffer.
		var mb [128]byte
		m := mb[:0]
		if r.Value != nil {
			m = append(m, encryptFieldValue...)
		}
		for i := range r.Headers {
			h := &r.Headers[i]
			if h.Value == nil || !e.sealsHeader(h.Key) {
				continue
			}
			sealed, err := seal(h.Value, encryptFieldHeader+h.Key)
			if err != nil {
				return err
			}
			h.Value = sealed
			if !markerLists(m, h.Key) {
				if len(m) > 0 {
					m = append(m, ',')
				}
				m = append(append(m, encryptFieldHeader...), h.Key...)
			}
		}
		buf, err := r.buffer(ctx, len(m))
		if err != nil {
			return err
		}
		marker = buf[:copy(buf, m)]
	}
	// Appended into the copy's spare slot when r was read in place.
	r.Value, r.Headers = value, append(r.Headers, Header{Key: HeaderEncrypted, Value: marker})
	return nil
}

// markerLists reports whether marker already names header name.
func markerLists(marker []byte, name string) bool {
	for f := range bytes.SplitSeq(marker, []byte{','}) {
		if string(f) == encryptFieldHeader+name {
			return true
		}
	}
	return false
}

// encryptFetch is the fetch-time half.
type encryptFetch struct{ e *Encrypt }

func (f encryptFetch) Name() string                 { return "encrypt" }
func (f encryptFetch) inline() bool                 { return f.e.ctxBound }
func (f encryptFetch) TopicPattern() *regexp.Regexp { return f.e.pattern }

// ProcessRecord opens the fields r's HeaderEncrypted marker names and
// removes the marker; a record without it passes unchanged (it was not
// sealed by the proxy, or sealed nothing). Each field is opened straight
// into the batch's pooled buffer (Record.buffer), charged to the chain's
// budget before it is written. Every field is opened before r is changed:
// a record that fails is never half-opened.
// Errors are *DecryptError naming the topic, partition, offset and field.
func (f encryptFetch) ProcessRecord(ctx context.Context, r *Record) error {
	at := -1
	for i, h := range r.Headers {
		if h.Key == HeaderEncrypted {
			if at >= 0 {
				return f.fail(r, HeaderEncrypted, fmt.Errorf("%w: the header %s appears twice", envelope.ErrFormat, HeaderEncrypted))
			}
			at = i
		}
	}
	if at < 0 {
		return nil
	}
	marker := r.Headers[at].Value
	value := false
	var names []string // headers named by the marker, when not only the value
	if len(marker) == 0 {
		return f.fail(r, HeaderEncrypted, fmt.Errorf("%w: an empty %s header", envelope.ErrFormat, HeaderEncrypted))
	}
	for field := range bytes.SplitSeq(marker, []byte{','}) {
		switch {
		case string(field) == encryptFieldValue && !value:
			if r.Value == nil {
				return f.fail(r, encryptFieldValue, fmt.Errorf("%w: the marker names the value, which is null", envelope.ErrFormat))
			}
			value = true
		case bytes.HasPrefix(field, []byte(encryptFieldHeader)) && len(field) > len(encryptFieldHeader):
			name := string(field[len(encryptFieldHeader):])
			if slices.Contains(names, name) {
				return f.fail(r, HeaderEncrypted, fmt.Errorf("%w: %s=%q names a field twice", envelope.ErrFormat, HeaderEncrypted, marker))
			}
			names = append(names, name)
			n := 0
			for i, h := range r.Headers {
				if i != at && h.Key == name && h.Value != nil {
					n++
				}
			}
			if n == 0 {
				return f.fail(r, encryptFieldHeader+name, fmt.Errorf("%w: the marker names a header the record lacks (or whose value is null)", envelope.ErrFormat))
			}
		default:
			return f.fail(r, HeaderEncrypted, fmt.Errorf("%w: %s=%q names a field twice or not a field (value, header:<name>)", envelope.ErrFormat, HeaderEncrypted, marker))
		}
	}
	// Every field is opened into the batch's buffer before r is changed:
	// a record that fails is left as it came. opened holds the headers'
	// plaintexts, in header order (on the stack for up to four).
	open := func(sealed []byte, field string) ([]byte, error) {
		buf, err := r.buffer(ctx, envelope.OpenedRecordSize(sealed))
		if err != nil {
			return nil, err
		}
		plain, err := f.e.kr.OpenRecord(ctx, buf[:0], sealed, envelope.RecordAAD{Topic: r.Topic, Field: field})
		if err != nil {
			return nil, f.fail(r, field, err)
		}
		return notNull(plain), nil
	}
	out := r.Value
	if value {
		var err error
		if out, err = open(r.Value, encryptFieldValue); err != nil {
			return err
		}
	}
	var small [4][]byte
	opened := small[:0]
	for i, h := range r.Headers {
		if i != at && h.Value != nil && slices.Contains(names, h.Key) {
			plain, err := open(h.Value, encryptFieldHeader+h.Key)
			if err != nil {
				return err
			}
			opened = append(opened, plain)
		}
	}
	// The marker removed and the opened values set, in place.
	hs, k := r.Headers[:0], 0
	for i, h := range r.Headers {
		if i == at {
			continue
		}
		if h.Value != nil && slices.Contains(names, h.Key) {
			h.Value, k = opened[k], k+1
		}
		hs = append(hs, h)
	}
	r.Value, r.Headers = out, hs
	return nil
}

// notNull keeps an empty plaintext empty: Kafka's null is a nil slice.
func notNull(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (f encryptFetch) fail(r *Record, field string, err error) error {
	return &DecryptError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Field: field, Err: err}
}
