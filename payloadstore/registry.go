package payloadstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"sync"
	"time"
)

// Options configure a store opened by URL.
type Options struct {
	// IDGenerator names objects whose Payload.ID is empty; nil means IDUUID.
	IDGenerator IDGenerator
	// ReadOnly: the caller only downloads (a consumer). The store must
	// already exist; it is neither created nor checked for writing, so a
	// mistyped URL fails instead of making an empty store.
	ReadOnly bool
	// PartSizeBytes is the size in bytes of each part of a multipart
	// (S3), resumable (GCS) or block (Azure) upload; 0 means
	// DefaultPartSizeBytes (8 MiB), the least is 5 MiB. Config key
	// large.message.payload.store.part.size.bytes.
	PartSizeBytes int
	// UploadConcurrency is how many parts of one upload are in flight at
	// once; 0 means DefaultUploadConcurrency (4). An upload buffers about
	// PartSizeBytes × UploadConcurrency bytes. Config key
	// large.message.payload.store.upload.concurrency.
	UploadConcurrency int
	// DownloadPartBytes is the size in bytes of each ranged GET of a
	// download from a cloud store; 0 means DefaultDownloadPartBytes
	// (8 MiB), the least is 256 KiB. An object of at most this size is
	// read with one GET. Config key
	// large.message.payload.store.download.part.bytes.
	DownloadPartBytes int
	// DownloadConcurrency is how many ranged GETs of one download are in
	// flight (or fetched and not yet read) at once; 0 means
	// DefaultDownloadConcurrency (8), 1 reads every object with one GET. A
	// download holds at most DownloadPartBytes × DownloadConcurrency bytes
	// (64 MiB by default). Config key
	// large.message.payload.store.download.concurrency.
	DownloadConcurrency int
	// DownloadBudget, when its Take is set, is charged for every buffer of
	// a ranged download, without waiting: with no room a download goes on
	// with fewer ranges in flight, or as one stream (no buffer). The proxy
	// passes proxy.memory.max.bytes, so that its memory bound holds.
	DownloadBudget Budget
	// OpenTimeout bounds the check an opener makes that the store answers
	// (a cloud bucket's IsAccessible; 0: DefaultPolicy's Timeout, 60 s): a
	// server that accepts connections and never answers fails the open
	// with a retryable *Error rather than holding it. largemessage passes
	// large.message.payload.store.timeout.ms.
	OpenTimeout time.Duration
}

// Opener opens a store for a parsed URL. It should check that the store is
// reachable and writable, so that a bad URL or missing credentials fail at
// start-up rather than at the first large record.
type Opener func(ctx context.Context, u *url.URL, opts Options) (PayloadStore, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Opener{}
)

// Register makes a store available to Open under a URL scheme ("file",
// "mem", "s3", …). It panics if the scheme is already taken, as
// database/sql.Register does.
func Register(scheme string, open Opener) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[scheme]; dup {
		panic("payloadstore: scheme registered twice: " + scheme)
	}
	registry[scheme] = open
}

// Schemes lists the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for s := range registry {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Open opens the store that rawURL names. Errors: ErrUnknownScheme wrapped in
// an *Error for an unregistered scheme, a parse error for a malformed URL,
// and whatever the store's Opener returns (unreachable, not writable).
func Open(ctx context.Context, rawURL string, opts Options) (PayloadStore, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// *url.Error repeats the whole URL, secrets included: keep only
		// its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, &Error{Op: "open", Path: RedactURL(rawURL), Err: fmt.Errorf("%w: malformed URL: %v", ErrInvalidConfig, err)}
	}
	registryMu.RLock()
	open := registry[u.Scheme]
	registryMu.RUnlock()
	if open == nil {
		return nil, &Error{Op: "open", Path: RedactURL(rawURL), Err: fmt.Errorf("%w %q (known: %v)", ErrUnknownScheme, u.Scheme, Schemes())}
	}
	if opts.IDGenerator == nil {
		opts.IDGenerator = IDUUID{}
	}
	return open(ctx, u, opts)
}

// RedactURL returns a store URL fit for logs and errors: user info is
// dropped, secret-bearing query parameters (sig, X-Amz-Signature,
// X-Amz-Security-Token, AccountKey, …) are masked, and so is a password inside
// a nested URL (endpoint=http://user:pass@host). An unparsable URL gives
// "<unparsable URL>".
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	u.User = nil
	return scrubText(u.String())
}
