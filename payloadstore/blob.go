package payloadstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"

	"github.com/google/uuid"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// Classes written into references by the cloud stores.
const (
	S3StoreClass        = "ferry.payloadstore.S3Store"
	GCSStoreClass       = "ferry.payloadstore.GCSStore"
	AzureBlobStoreClass = "ferry.payloadstore.AzureBlobStore"
)

// Defaults of the upload knobs (Options.PartSizeBytes, Options.UploadConcurrency):
// 8 MiB parts, 4 in flight, so an upload buffers at most about 32 MiB
// whatever the payload's size.
const (
	DefaultPartSizeBytes     = 8 << 20
	DefaultUploadConcurrency = 4
	// minPartSizeBytes is S3's smallest multipart part (5 MiB).
	minPartSizeBytes = 5 << 20
)

// downloadResumes bounds how often one download reopens the object at the
// offset it had reached after a read fails mid-stream.
const downloadResumes = 3

// The URL schemes of the cloud stores (gocloud.dev's s3blob, gcsblob and
// azureblob). cloud.go registers them; a build with the ferry_nocloud tag
// leaves the cloud SDKs out and registers none (cloud_none.go).
const (
	schemeS3    = "s3"
	schemeGCS   = "gs"
	schemeAzure = "azblob"
)

// BlobStore is a PayloadStore over a gocloud.dev/blob bucket: Amazon S3 (and
// S3-compatible servers), Google Cloud Storage or Azure Blob Storage, opened
// from a URL:
//
//	s3://BUCKET/PREFIX?region=REGION&endpoint=URL&use_path_style=true
//	gs://BUCKET/PREFIX
//	azblob://CONTAINER/PREFIX
//
// Credentials come from each cloud's standard chain (environment variables,
// profile and credential files, instance or workload identity) exactly as
// gocloud.dev and the cloud SDKs read them; Ferry takes none in the URL, and
// none appear in a full path, a log line or an error. The query parameters
// are gocloud.dev's (for S3: region, endpoint, profile, use_path_style,
// disable_https, ssetype, kmskeyid, ...); they are not part of a full path,
// which is "s3://BUCKET/PREFIX/<topic>/<shard>/<id>".
//
// Uploads stream: S3 uses multipart uploads, GCS resumable uploads and Azure
// block blobs, with Options.PartSizeBytes per part and
// Options.UploadConcurrency parts in flight. The object becomes visible only
// when the upload completes; a failed or cancelled upload is aborted and
// leaves nothing under its key. Downloads stream: an object larger than
// Options.DownloadPartBytes is read with concurrent ranged GETs,
// Options.DownloadConcurrency in flight, delivered in order, so a download
// holds at most DownloadPartBytes × DownloadConcurrency bytes (64 MiB by
// default); a smaller one is one GET. A read that fails mid-stream asks for
// the rest of its range (or object) again from the offset reached, up to 3
// times.
type BlobStore struct {
	bucket      *blob.Bucket
	root        Root
	class       string
	gen         IDGenerator
	partSize    int
	concurrency int
	// Downloads: range size and ranges in flight (download.go).
	dlPart        int
	dlConcurrency int
	budget        Budget // download buffers are charged to it
	// For S3 only: aborts the multipart uploads of a full key (the bucket's
	// prefix included) that a failed or cancelled Publish could not abort
	// itself, and sizes a streamed upload's first part (cloud.go); nil for
	// the other clouds.
	s3        *s3Uploads
	abortMu   sync.Mutex     // guards closing and aborts.Add against Close's Wait
	closing   bool           // Close has begun: no abort is added to aborts
	aborts    sync.WaitGroup // abortIncomplete's, waited for by Close
	conns     *connSet       // S3: the client's connections, closed by Close
	keyPrefix string         // the URL's prefix and "/", or ""
}

func openBlob(class string) Opener {
	return func(ctx context.Context, u *url.URL, opts Options) (PayloadStore, error) {
		return OpenBlobStore(ctx, u, class, opts)
	}
}

// OpenBlobStore opens the bucket u names (see BlobStore for the URL forms)
// and checks, once, that it exists and the credentials may list it, so that a
// missing bucket or wrong credentials fail at start-up. Errors are *Error
// with Op "open"; a missing bucket or refused credentials are not retryable.
func OpenBlobStore(ctx context.Context, u *url.URL, class string, opts Options) (*BlobStore, error) {
	bucketName := u.Host
	prefix := strings.Trim(u.Path, "/")
	root := Root(u.Scheme + "://" + bucketName)
	if prefix != "" {
		root = Root(string(root) + "/" + prefix)
	}
	fail := func(retryable bool, err error) (*BlobStore, error) {
		return nil, &Error{Op: "open", Path: string(root), Retryable: retryable, Err: scrub(err)}
	}
	if bucketName == "" {
		return fail(false, fmt.Errorf("%w: no bucket in the URL (want %s://BUCKET/PREFIX)", ErrInvalidConfig, u.Scheme))
	}
	if u.User != nil {
		return fail(false, fmt.Errorf("%w: credentials in the URL are not accepted; use the cloud's standard credential chain", ErrInvalidConfig))
	}
	if prefix != "" {
		if err := checkRawKey(prefix); err != nil || len(prefix) > MaxSegmentBytes {
			return fail(false, fmt.Errorf("%w: bad prefix %q", ErrInvalidConfig, prefix))
		}
	}
	partSize := opts.PartSizeBytes
	if partSize == 0 {
		partSize = DefaultPartSizeBytes
	}
	if partSize < minPartSizeBytes {
		return fail(false, fmt.Errorf("%w: large.message.payload.store.part.size.bytes is %d; it must be at least %d (S3's smallest part)", ErrInvalidConfig, partSize, minPartSizeBytes))
	}
	concurrency := opts.UploadConcurrency
	if concurrency == 0 {
		concurrency = DefaultUploadConcurrency
	}
	if concurrency < 1 {
		return fail(false, fmt.Errorf("%w: large.message.payload.store.upload.concurrency is %d; it must be at least 1", ErrInvalidConfig, concurrency))
	}
	dlPart, dlConc := opts.DownloadPartBytes, opts.DownloadConcurrency
	if dlPart == 0 {
		dlPart = DefaultDownloadPartBytes
	}
	if dlConc == 0 {
		dlConc = DefaultDownloadConcurrency
	}
	if dlPart < minDownloadPartBytes {
		return fail(false, fmt.Errorf("%w: large.message.payload.store.download.part.bytes is %d; it must be at least %d", ErrInvalidConfig, dlPart, minDownloadPartBytes))
	}
	if dlConc < 1 {
		return fail(false, fmt.Errorf("%w: large.message.payload.store.download.concurrency is %d; it must be at least 1", ErrInvalidConfig, dlConc))
	}
	// gocloud.dev takes the bucket from the host and its own options from
	// the query; the prefix is applied with PrefixedBucket below.
	b, s3u, conns, err := openCloudBucket(ctx, u, bucketName, max(dlConc, concurrency))
	if err != nil {
		hint := ""
		if u.Scheme == schemeAzure && os.Getenv("AZURE_STORAGE_ACCOUNT") == "" {
			hint = " (set AZURE_STORAGE_ACCOUNT, and AZURE_STORAGE_KEY or another Azure credential: docs/OPERATIONS.md)"
		}
		return fail(false, fmt.Errorf("%w: %v%s", ErrInvalidConfig, scrub(err), hint))
	}
	if prefix != "" {
		b = blob.PrefixedBucket(b, prefix+"/")
	}
	actx, cancel := context.WithTimeout(ctx, cmp.Or(opts.OpenTimeout, DefaultPolicy.Timeout))
	ok, err := b.IsAccessible(actx)
	cancel()
	if err != nil {
		b.Close()
		if conns != nil {
			conns.close()
		}
		return fail(retryable(err), fmt.Errorf("cannot reach the bucket (check the credentials and the endpoint): %w", err))
	}
	if !ok {
		b.Close()
		if conns != nil {
			conns.close()
		}
		return fail(false, fmt.Errorf("%w: bucket (or container) %q does not exist", ErrInvalidConfig, bucketName))
	}
	st := &BlobStore{bucket: b, root: root, class: class, gen: opts.IDGenerator, partSize: partSize, concurrency: concurrency,
		dlPart: dlPart, dlConcurrency: dlConc, budget: opts.DownloadBudget, s3: s3u, conns: conns}
	if prefix != "" {
		st.keyPrefix = prefix + "/"
	}
	return st, nil
}

func (s *BlobStore) Class() string       { return s.class }
func (s *BlobStore) ID(p Payload) string { return s.gen.ID(p) }
func (s *BlobStore) Close() error {
	// The aborts of failed uploads still running need the client (each
	// is bounded: 30 s, or the undo bound of the Publish's context).
	s.abortMu.Lock()
	s.closing = true
	s.abortMu.Unlock()
	s.aborts.Wait()
	err := s.bucket.Close()
	if s.conns != nil {
		s.conns.close()
	}
	return err
}

// Root returns the URL prefix of every full path of this store.
func (s *BlobStore) Root() Root { return s.root }

// onePass is false for a payload that can be read twice: the object's
// ferry-sha256 metadata is set when the upload starts, so an Unhashed
// payload is hashed first. A ReadOnce payload (a value streamed from a
// client's socket) is written in one pass, without that metadata: nothing
// in Ferry reads it (references carry the digest in their
// ferry.payload.sha256 header, and readers check the bytes they download
// against it), so an object without it is read like any other.
func (s *BlobStore) onePass(p Payload) bool { return p.ReadOnce && (p.ID != "" || randomIDs(s.gen)) }

// MaxStreamUploadBuffer bounds the part buffers of a ReadOnce upload (a
// value streamed from a proxy client, fed at the client's pace, where
// large parts and many in flight gain nothing): such an upload uses parts
// of S3's smallest size (5 MiB), at most MaxStreamUploadBuffer / 5 MiB of
// them in flight (2), below large.message.payload.store.upload.concurrency.
// (The S3 uploader holds one more part being filled, and reads the first
// part whole before it starts the multipart upload.)
const MaxStreamUploadBuffer = 10 << 20

// ReadOnceUploadBytes is the most memory one ReadOnce upload holds in
// any store of this package (20 MiB): the S3 uploader's first part, read
// whole to start the multipart upload, and its part buffers
// (MaxStreamUploadBuffer, plus the part being filled; GCS and Azure hold
// less). The proxy charges it to proxy.memory.max.bytes for each value it
// streams.
const ReadOnceUploadBytes = minPartSizeBytes + MaxStreamUploadBuffer + minPartSizeBytes

// streamUploadParts returns the part size and parts in flight of a
// ReadOnce upload (MaxStreamUploadBuffer).
func streamUploadParts(concurrency int) (partSize, inFlight int) {
	return minPartSizeBytes, max(1, min(concurrency, MaxStreamUploadBuffer/minPartSizeBytes))
}

func (s *BlobStore) Publish(ctx context.Context, topic string, p Payload) (PayloadResponse, error) {
	var err error
	if !s.onePass(p) {
		if p, err = hashFirst(ctx, p); err != nil {
			return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(topic), Retryable: !errors.Is(err, ErrPayloadChanged) && !errors.Is(err, ErrNotRewindable), Err: err}
		}
	}
	key, err := objectKey(topic, objectID(s.gen, p))
	if err != nil {
		return PayloadResponse{}, err
	}
	full := s.root.Path(key)
	if _, err := p.Body.Seek(0, io.SeekStart); err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: full, Err: err}
	}
	// Cancelling the writer's context before Close aborts the upload
	// (gocloud.dev/blob: S3 AbortMultipartUpload, no GCS/Azure commit), so
	// nothing half-written ever appears under key.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var meta map[string]string
	if !p.Unhashed {
		meta = map[string]string{"ferry-sha256": p.HexSHA256()}
	}
	wo := &blob.WriterOptions{
		BufferSize:     s.partSize,
		MaxConcurrency: s.concurrency,
		ContentType:    "application/octet-stream",
		Metadata:       meta,
	}
	if p.ReadOnce {
		wo.BufferSize, wo.MaxConcurrency = streamUploadParts(s.concurrency)
		if s.s3 != nil {
			wo.BeforeWrite = s.s3.partSized(wo.BufferSize, wo.MaxConcurrency)
		}
	}
	w, err := s.bucket.NewWriter(wctx, key, wo)
	if err != nil {
		return PayloadResponse{}, s.fail("publish", full, err)
	}
	// The digest is checked before Close commits the object: bytes that
	// are not the payload's never become visible under key (which, for a
	// content id, may already be referenced by other records).
	body := newDigestReader(io.LimitReader(p.Body, p.Size+1))
	_, err = w.ReadFrom(body)
	var sum [sha256.Size]byte
	if err == nil {
		sum, err = body.check(p)
	}
	if err != nil {
		cancel()
		w.Close()
		s.abortIncomplete(ctx, key)
		if errors.Is(err, ErrPayloadChanged) {
			return PayloadResponse{}, &Error{Op: "publish", Path: full, Err: err}
		}
		return PayloadResponse{}, s.fail("publish", full, err)
	}
	if err := w.Close(); err != nil {
		s.abortIncomplete(ctx, key)
		return PayloadResponse{}, s.fail("publish", full, err)
	}
	return PayloadResponse{FullPayloadPath: full, SHA256: sum}, nil
}

func (s *BlobStore) Download(ctx context.Context, fullPath string) (io.ReadCloser, error) {
	key, err := s.root.keyFor("download", fullPath)
	if err != nil {
		return nil, err
	}
	return s.download(ctx, key, fullPath)
}

func (s *BlobStore) Delete(ctx context.Context, fullPath string) error {
	key, err := s.root.keyFor("delete", fullPath)
	if err != nil {
		return err
	}
	if err := s.bucket.Delete(ctx, key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return s.fail("delete", fullPath, err)
	}
	return nil
}

// List implements Lister (ferry gc's own keys are left out).
func (s *BlobStore) List(ctx context.Context, topic string, fn func(ObjectInfo) error) error {
	prefix, err := TopicPrefix(topic)
	if err != nil {
		return err
	}
	return s.list(ctx, prefix, false, func(_ string, o ObjectInfo) error { return fn(o) })
}

func (s *BlobStore) list(ctx context.Context, prefix string, all bool, fn func(string, ObjectInfo) error) error {
	it := s.bucket.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return s.fail("list", s.root.Path(prefix), err)
		}
		if obj.IsDir || (!all && isGCKey(obj.Key)) {
			continue
		}
		oi := ObjectInfo{FullPath: s.root.Path(obj.Key), Size: obj.Size, ModTime: obj.ModTime,
			Version: fmt.Sprintf("%x:%d", obj.MD5, obj.ModTime.UnixNano())}
		if err := fn(obj.Key, oi); err != nil {
			return err
		}
	}
}

// checkKey checks a raw key of an ObjectStore call.
func (s *BlobStore) checkKey(op, key string) error {
	if err := checkRawKey(key); err != nil {
		return &Error{Op: op, Path: s.root.Path(key), Err: err}
	}
	return nil
}

// Stat implements ObjectStore.
func (s *BlobStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if err := s.checkKey("stat", key); err != nil {
		return ObjectInfo{}, err
	}
	a, err := s.bucket.Attributes(ctx, key)
	if err != nil {
		return ObjectInfo{}, s.fail("stat", s.root.Path(key), err)
	}
	return ObjectInfo{FullPath: s.root.Path(key), Size: a.Size, ModTime: a.ModTime,
		Version: fmt.Sprintf("%x:%d", a.MD5, a.ModTime.UnixNano())}, nil
}

// Copy implements ObjectStore with the cloud's server-side copy.
func (s *BlobStore) Copy(ctx context.Context, src, dst string) error {
	for _, k := range []string{src, dst} {
		if err := s.checkKey("copy", k); err != nil {
			return err
		}
	}
	if err := s.bucket.Copy(ctx, dst, src, nil); err != nil {
		return s.fail("copy", s.root.Path(src), err)
	}
	return nil
}

// Touch implements ObjectStore: GCS and Azure copy the object onto itself,
// which gives it a new ModTime. S3 allows a copy onto itself only with new
// metadata, and S3-compatible servers differ in whether that changes the
// ModTime (Versity's does not), so for S3 the object is copied to a
// temporary key in gc's folder and back (it stays readable throughout).
func (s *BlobStore) Touch(ctx context.Context, key string) error {
	if err := s.checkKey("touch", key); err != nil {
		return err
	}
	if s.s3 == nil { // not S3
		if err := s.bucket.Copy(ctx, key, key, nil); err != nil {
			return s.fail("touch", s.root.Path(key), err)
		}
		return nil
	}
	kp, err := ParseKey(key)
	if err != nil {
		return &Error{Op: "touch", Path: s.root.Path(key), Err: err}
	}
	tmp := kp.Topic + "/" + gcFolder + "/touch/" + uuid.NewString()
	if err := s.Copy(ctx, key, tmp); err != nil {
		return err
	}
	defer s.Remove(context.WithoutCancel(ctx), tmp) //nolint:errcheck // a leftover is gc's to remove
	return s.Copy(ctx, tmp, key)
}

// Move implements ObjectStore: a copy, then a delete of src.
func (s *BlobStore) Move(ctx context.Context, src, dst string) error {
	if err := s.Copy(ctx, src, dst); err != nil {
		return err
	}
	return s.Remove(ctx, src)
}

// Remove implements ObjectStore.
func (s *BlobStore) Remove(ctx context.Context, key string) error {
	if err := s.checkKey("delete", key); err != nil {
		return err
	}
	if err := s.bucket.Delete(ctx, key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return s.fail("delete", s.root.Path(key), err)
	}
	return nil
}

// Put implements ObjectStore: one upload, committed only when complete.
func (s *BlobStore) Put(ctx context.Context, key string, b []byte) error {
	if err := s.checkKey("put", key); err != nil {
		return err
	}
	if err := s.bucket.WriteAll(ctx, key, b, &blob.WriterOptions{ContentType: "application/json"}); err != nil {
		return s.fail("put", s.root.Path(key), err)
	}
	return nil
}

// Get implements ObjectStore.
func (s *BlobStore) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	if err := s.checkKey("get", key); err != nil {
		return nil, err
	}
	r, err := s.bucket.NewReader(ctx, key, nil)
	if err != nil {
		return nil, s.fail("get", s.root.Path(key), err)
	}
	defer r.Close()
	return readAtMost(r, max, "get", s.root.Path(key))
}

// ListKeys implements ObjectStore.
func (s *BlobStore) ListKeys(ctx context.Context, prefix string, fn func(string, ObjectInfo) error) error {
	return s.list(ctx, prefix, true, fn)
}

// fail turns a gocloud.dev error into an *Error: NotFound wraps
// ErrPayloadNotFound; the codes another attempt cannot fix (permission,
// invalid argument, failed precondition, unimplemented) are fatal; the rest
// (unavailable, throttled, timeouts, connection errors) are retryable.
func (s *BlobStore) fail(op, path string, err error) error {
	if bucketMissing(err) {
		return &Error{Op: op, Path: path, Err: fmt.Errorf("%w: the bucket does not exist: %v", ErrInvalidConfig, scrub(err))}
	}
	if gcerrors.Code(err) == gcerrors.NotFound || httpStatus(err) == http.StatusNotFound {
		return &Error{Op: op, Path: path, Err: fmt.Errorf("%w: %v", ErrPayloadNotFound, scrub(err))}
	}
	return &Error{Op: op, Path: path, Retryable: retryable(err), Err: scrub(err)}
}

// retryable classifies a store error: by the HTTP status when the SDK
// reports one (408, 429 and 5xx are worth another attempt; other 4xx, such as
// 403 for wrong credentials, are not), else by gocloud.dev's error code.
func retryable(err error) bool {
	if st := httpStatus(err); st != 0 {
		return st == http.StatusRequestTimeout || st == http.StatusTooManyRequests || st >= 500
	}
	switch gcerrors.Code(err) {
	case gcerrors.NotFound, gcerrors.PermissionDenied, gcerrors.InvalidArgument,
		gcerrors.FailedPrecondition, gcerrors.Unimplemented, gcerrors.AlreadyExists, gcerrors.Canceled:
		return false
	}
	return true
}

// abortIncomplete aborts, in the background, the S3 multipart uploads of
// key begun in the last hour. gocloud.dev aborts a failed upload with the upload's own context,
// which is already over when a timeout or a cancel caused the failure; the
// parts would stay, invisible but billed. A fresh context bounded to 30 s is
// used here. Other stores need nothing: uncommitted GCS resumable uploads and
// Azure blocks expire by themselves. Failures are ignored (a bucket lifecycle
// rule AbortIncompleteMultipartUpload is the backstop, docs/OPERATIONS.md).
// Close waits for it: a process that closes its stores and exits (ferry
// proxy's Shutdown) does not leave the parts behind. Its context is
// Undo(ctx)'s, so that an UndoBound stopped at shutdown.timeout.ms ends it.
func (s *BlobStore) abortIncomplete(ctx context.Context, key string) {
	if s.s3 == nil {
		return
	}
	// In the background: the publish has failed already and must not wait
	// beyond large.message.payload.store.timeout.ms for the clean-up.
	s.abortMu.Lock()
	defer s.abortMu.Unlock()
	if s.closing {
		// A publish that failed as the store closed: its client is
		// going; the bucket's lifecycle rule is the backstop.
		return
	}
	s.aborts.Add(1)
	go func() {
		defer s.aborts.Done()
		s.s3.abort(Undo(ctx), s.keyPrefix+key)
	}()
}

// resumingReader reads an object; when a read fails mid-stream with a
// retryable error it reopens the object from the offset reached.
type resumingReader struct {
	ctx     context.Context
	s       *BlobStore
	key     string
	full    string
	r       *blob.Reader
	size    int64
	off     int64
	resumes int
}

func (rr *resumingReader) Read(p []byte) (int, error) {
	for {
		n, err := rr.r.Read(p)
		rr.off += int64(n)
		if err == nil || err == io.EOF || n > 0 {
			if err != nil && err != io.EOF {
				// Report the bytes now; the error recurs on the next Read.
				err = nil
			}
			return n, err
		}
		e := rr.s.fail("download", rr.full, err)
		if !IsRetryable(e) || rr.resumes >= downloadResumes || rr.ctx.Err() != nil || rr.off >= rr.size {
			return 0, e
		}
		rr.resumes++
		rr.r.Close()
		r, oerr := rr.s.bucket.NewRangeReader(rr.ctx, rr.key, rr.off, -1, nil)
		if oerr != nil {
			return 0, errors.Join(e, rr.s.fail("download", rr.full, oerr))
		}
		rr.r = r
	}
}

func (rr *resumingReader) Close() error { return rr.r.Close() }

// secretParam matches the query parameters and connection-string fields that
// carry secrets in cloud URLs and messages (SAS signatures, presigned S3/GCS
// signatures, tokens, account keys).
var secretParam = regexp.MustCompile(`(?i)\b(sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential|access_token|accountkey|sharedaccesssignature|client_secret)=[^&\s;"']+`)

// urlPassword matches the password of user info inside a URL in a text.
var urlPassword = regexp.MustCompile(`(://[^/@\s:]*):[^/@\s]*@`)

// maxErrorText bounds the text of a store error: some SDK errors carry the
// whole response body (Azure's XML), which makes a log line unreadable.
const maxErrorText = 600

// scrubText masks secrets in a text; see secretParam and urlPassword.
func scrubText(s string) string {
	s = secretParam.ReplaceAllString(s, "$1=REDACTED")
	return urlPassword.ReplaceAllString(s, "$1:REDACTED@")
}

// scrub removes secrets from an error's text (see scrubText) and shortens
// very long texts. Errors without such text come back unchanged
// (errors.Is/As still see them).
func scrub(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := scrubText(msg)
	if len(clean) > maxErrorText {
		clean = strings.Join(strings.Fields(clean[:maxErrorText]), " ") + " …"
	}
	if clean == msg {
		return err
	}
	return &scrubbedError{msg: clean, err: err}
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// openKey reads the object at key as it is (Confirm's check of a
// quarantined copy).
func (s *BlobStore) openKey(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := s.checkKey("read", key); err != nil {
		return nil, err
	}
	r, err := s.bucket.NewReader(ctx, key, nil)
	if err != nil {
		return nil, s.fail("read", s.root.Path(key), err)
	}
	return r, nil
}
