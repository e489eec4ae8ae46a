//go:build !ferry_nocloud

package payloadstore_test

// Store faults against the real S3 server (versitygw), with a fault proxy in
// front of it for what a real server cannot be made to do on demand (be
// down, throttle, be slow, cut a response off).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/uuid"

	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

// s3ViaProxy returns the URL of a fresh prefix in a real S3 bucket, the same
// prefix reached through a fault proxy, and the proxy.
func s3ViaProxy(t *testing.T) (direct, viaProxy string, fp *faultproxy.Proxy) {
	t.Helper()
	return storetest.S3URLViaFaultProxy(t, "ferry-faults")
}

// fastPolicyFor is a retry policy with short backoffs so that fault tests
// stay quick; the SDK's own retries run inside each attempt.
func fastPolicyFor(timeout time.Duration) payloadstore.Policy {
	return payloadstore.Policy{Timeout: timeout, RetryCount: 2, RetryBackoff: 10 * time.Millisecond, RetryMaxBackoff: 50 * time.Millisecond, CustomMetadataMaxBytes: 128}
}

// listAll returns the full paths under topic in s.
func listAll(t *testing.T, s payloadstore.PayloadStore, topic string) []string {
	t.Helper()
	var out []string
	if err := payloadstore.List(context.Background(), s, topic, func(o payloadstore.ObjectInfo) error {
		out = append(out, o.FullPath)
		return nil
	}); err != nil {
		t.Fatalf("List: %v", err)
	}
	return out
}

// Down during upload: bounded retries, then a retryable *Error, and no
// object under the topic.
func TestS3DownDuringUpload(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := s3ViaProxy(t)
	s := payloadstore.Wrap(openURL(t, via), fastPolicyFor(30*time.Second))
	fp.Set(faultproxy.Down, -1)
	_, err := payloadstore.PublishBytes(ctx, s, "orders", randPayload(t, 6<<20))
	var se *payloadstore.Error
	if !errors.As(err, &se) || !se.Retryable || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Fatalf("publish while the server is down: %v, want a retryable *Error after 3 attempts", err)
	}
	if n := fp.Count(faultproxy.Down); n < 3 {
		t.Fatalf("the server saw %d attempts, want at least 3 (one per Ferry attempt)", n)
	}
	if left := listAll(t, openURL(t, direct), "orders"); len(left) != 0 {
		t.Fatalf("a failed upload left objects: %v", left)
	}
}

// A multipart upload whose later parts fail must not leave a visible object:
// the upload is aborted.
func TestS3FailureMidMultipartLeavesNothing(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := s3ViaProxy(t)
	s := openURL(t, via) // no policy: one attempt
	// Let the multipart upload start and its first parts through, then go
	// down for good.
	go func() {
		for len(fp.Requests()) < 2 {
			time.Sleep(time.Millisecond)
		}
		fp.Set(faultproxy.Down, -1)
	}()
	_, err := payloadstore.PublishBytes(ctx, s, "orders", randPayload(t, 30<<20))
	if err == nil {
		t.Fatal("publish succeeded although the server went down mid-upload")
	}
	fp.Set(faultproxy.Pass, -1)
	if left := listAll(t, openURL(t, direct), "orders"); len(left) != 0 {
		t.Fatalf("an interrupted multipart upload left objects: %v", left)
	}
}

// Slow server: the attempt runs into large.message.payload.store.timeout.ms
// and the publish fails with a clear error instead of hanging.
func TestS3SlowUploadTimesOut(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := s3ViaProxy(t)
	s := payloadstore.Wrap(openURL(t, via), fastPolicyFor(2*time.Second))
	fp.SetDelay(time.Minute)
	fp.Set(faultproxy.Slow, -1)
	start := time.Now()
	_, err := payloadstore.PublishBytes(ctx, s, "orders", randPayload(t, 1<<20))
	if err == nil {
		t.Fatal("publish succeeded against a server that never answers")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("slow server: %v, want the timeout named", err)
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Fatalf("publish took %v; the 2 s timeout did not bound it", waited)
	}
	fp.Set(faultproxy.Pass, -1)
	if left := listAll(t, openURL(t, direct), "orders"); len(left) != 0 {
		t.Fatalf("a timed-out upload left objects: %v", left)
	}
}

// Found by review: a multipart upload cut short by the store timeout must
// not leave its parts behind (invisible, but billed): gocloud.dev's own abort
// runs with the expired context, so the store aborts with a fresh one.
func TestS3TimeoutMidMultipartLeavesNoParts(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := s3ViaProxy(t)
	s := payloadstore.Wrap(openURL(t, via), payloadstore.Policy{Timeout: 3 * time.Second, CustomMetadataMaxBytes: 128})
	// The upload starts and its first requests pass; then the two parts in
	// flight (UploadConcurrency 2) stall until the timeout ends the upload.
	// The server answers what comes after, as a server that recovered
	// would: the abort can get through.
	go func() {
		for len(fp.Requests()) < 2 {
			time.Sleep(time.Millisecond)
		}
		fp.SetDelay(time.Minute)
		fp.Set(faultproxy.Slow, 2)
	}()
	_, err := payloadstore.PublishBytes(ctx, s, "orders", randPayload(t, 40<<20))
	if err == nil {
		t.Fatal("publish succeeded although the server stalled past the timeout")
	}
	fp.Set(faultproxy.Pass, -1)
	u, _ := url.Parse(direct)
	prefix := strings.Trim(u.Path, "/") + "/"
	// The abort runs in the background: give it a bounded while.
	left := -1
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, lerr := storetest.S3Client(t).ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(u.Host), Prefix: aws.String(prefix)})
		if lerr != nil {
			t.Fatal(lerr)
		}
		if left = len(out.Uploads); left == 0 {
			break
		}
	}
	if left != 0 {
		t.Fatalf("%d multipart uploads left under %s after a timed-out publish (%v)", left, prefix, err)
	}
}

// Throttling (503 SlowDown and 429): requests are retried with backoff and
// the publish succeeds once the server accepts again; persistent throttling
// ends in a retryable error.
func TestS3Throttling(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			ctx := context.Background()
			_, via, fp := s3ViaProxy(t)
			s := payloadstore.Wrap(openURL(t, via), fastPolicyFor(60*time.Second))
			fp.SetThrottleStatus(status)
			fp.Set(faultproxy.Throttle, 3)
			data := randPayload(t, 100<<10)
			resp, err := payloadstore.PublishBytes(ctx, s, "orders", data)
			if err != nil {
				t.Fatalf("publish after 3 throttled requests: %v", err)
			}
			reqs := fp.Requests()
			if fp.Count(faultproxy.Throttle) != 3 || len(reqs) < 4 {
				t.Fatalf("saw %d requests (%d throttled), want 3 throttled then a retry", len(reqs), fp.Count(faultproxy.Throttle))
			}
			// Backoff: the retries were not fired back to back.
			if gap := reqs[3].At.Sub(reqs[0].At); gap < 5*time.Millisecond {
				t.Fatalf("three retries within %v: no backoff", gap)
			}
			got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("download after throttling: %v", err)
			}

			fp.Set(faultproxy.Throttle, -1)
			_, err = payloadstore.PublishBytes(ctx, s, "orders", data)
			if !payloadstore.IsRetryable(err) {
				t.Fatalf("persistent throttling: %v, want a retryable error", err)
			}
		})
	}
}

// Down during download: retries, then a retryable error, never
// ErrPayloadNotFound; a really missing object is ErrPayloadNotFound.
func TestS3DownDuringDownload(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := s3ViaProxy(t)
	data := randPayload(t, 1<<20)
	resp, err := payloadstore.PublishBytes(ctx, openURL(t, direct), "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	s := payloadstore.Wrap(openURL(t, via), fastPolicyFor(30*time.Second))
	fp.Set(faultproxy.Down, -1)
	_, err = payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
	if err == nil || errors.Is(err, payloadstore.ErrPayloadNotFound) || !payloadstore.IsRetryable(err) {
		t.Fatalf("download while the server is down: %v, want a retryable error that is not ErrPayloadNotFound", err)
	}
	// Back up: the same download works, and a missing object is reported
	// as missing.
	fp.Set(faultproxy.Pass, -1)
	got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download after the server came back: %v", err)
	}
	ops, err := payloadstore.Objects(s)
	if err != nil {
		t.Fatal(err)
	}
	key, err := payloadstore.ObjectKey("orders", uuid.NewString()) // a well-formed key nothing was published to
	if err != nil {
		t.Fatal(err)
	}
	missing := ops.Root().Path(key)
	if _, err := payloadstore.DownloadBytes(ctx, s, missing); !errors.Is(err, payloadstore.ErrPayloadNotFound) || payloadstore.IsRetryable(err) {
		t.Fatalf("download of a missing object: %v, want ErrPayloadNotFound, not retryable", err)
	}
}

// A download cut off mid-body resumes from the offset reached and yields the
// exact bytes.
func TestS3DownloadResumesAfterCut(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := s3ViaProxy(t)
	data := randPayload(t, 3<<20)
	resp, err := payloadstore.PublishBytes(ctx, openURL(t, direct), "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	s := openURL(t, via)
	fp.SetCutAfter(1 << 20)
	fp.Set(faultproxy.CutBody, 1)
	got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download cut after 1 MiB: %d bytes, %v; want the %d original bytes", len(got), err, len(data))
	}
	if n := len(fp.Requests()); n < 2 {
		t.Fatalf("saw %d requests, want the first GET and a ranged resume", n)
	}
}

// Wrong credentials and a missing bucket fail at Open, once, with a clear
// error that carries no secret.
func TestCloudStartupErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("S3MissingBucket", func(t *testing.T) {
		raw := s3URL(t, "ferry-conformance")
		u, _ := url.Parse(raw)
		u.Host = "no-such-bucket-" + uuid.NewString()[:8]
		_, err := payloadstore.Open(ctx, u.String(), payloadstore.Options{})
		if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), u.Host) {
			t.Fatalf("Open of a missing bucket: %v, want an error naming the bucket", err)
		}
	})
	t.Run("S3WrongCredentials", func(t *testing.T) {
		raw := s3URL(t, "ferry-conformance")
		secret := "wrong-secret-" + uuid.NewString()
		t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
		_, err := payloadstore.Open(ctx, raw, payloadstore.Options{})
		if err == nil || payloadstore.IsRetryable(err) {
			t.Fatalf("Open with a wrong secret key: %v, want a non-retryable error", err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("the error carries the secret: %v", err)
		}
		t.Logf("wrong credentials: %v", err)
	})
	t.Run("GCSMissingBucket", func(t *testing.T) {
		gcsURL(t, "ferry-conformance")
		name := "no-such-bucket-" + uuid.NewString()[:8]
		_, err := payloadstore.Open(ctx, "gs://"+name+"/p", payloadstore.Options{})
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("Open of a missing GCS bucket: %v, want an error naming it", err)
		}
	})
	t.Run("AzureMissingContainer", func(t *testing.T) {
		azureURL(t, "ferry-conformance")
		name := "no-such-container-" + uuid.NewString()[:8]
		_, err := payloadstore.Open(ctx, "azblob://"+name+"/p", payloadstore.Options{})
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("Open of a missing Azure container: %v, want an error naming it", err)
		}
	})
	t.Run("AzureWrongKey", func(t *testing.T) {
		// gocloud.dev reads the Azure environment once per process, so the
		// open runs in a child process with the wrong key.
		raw := azureURL(t, "ferry-conformance")
		key := "d3Jvbmcta2V5LXRoYXQtaXMtbm90LXRoZS1yZWFsLW9uZQ==" // base64 of a wrong key
		cmd := exec.Command(os.Args[0], "-test.run", "^TestOpenInChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "AZURE_STORAGE_KEY="+key, "FERRY_TEST_OPEN_URL="+raw)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		text := string(out)
		if !strings.Contains(text, "OPEN-FAILED retryable=false") {
			t.Fatalf("Open with a wrong account key, in a child process:\n%s\nwant a non-retryable failure", text)
		}
		if strings.Contains(text, key) {
			t.Fatalf("the error carries the key:\n%s", text)
		}
	})
	t.Run("CredentialsInURLRefused", func(t *testing.T) {
		_, err := payloadstore.Open(ctx, "s3://AKIA:secret@bucket/p", payloadstore.Options{})
		if err == nil || strings.Contains(err.Error(), "secret") {
			t.Fatalf("Open with user info in the URL: %v, want a refusal that does not echo it", err)
		}
	})
}

// TestOpenInChild is run by TestCloudStartupErrors in a child process (with
// FERRY_TEST_OPEN_URL set) to open a store under another environment; run
// directly, it has nothing to do.
func TestOpenInChild(t *testing.T) {
	raw := os.Getenv("FERRY_TEST_OPEN_URL")
	if raw == "" {
		t.Skip("only run as a child of TestCloudStartupErrors")
	}
	s, err := payloadstore.Open(context.Background(), raw, payloadstore.Options{})
	if err != nil {
		fmt.Printf("OPEN-FAILED retryable=%v: %v\n", payloadstore.IsRetryable(err), err)
		return
	}
	s.Close()
	fmt.Println("OPEN-OK")
}

// viaProxy opens the same bucket prefix as rawURL, once directly and once
// through a fault proxy in front of the store's server, for each cloud.
func viaProxyFor(t *testing.T, kind string) (direct, via payloadstore.PayloadStore, fp *faultproxy.Proxy) {
	t.Helper()
	var raw, upstream string
	switch kind {
	case "s3":
		raw, upstream = s3URL(t, "ferry-faults"), os.Getenv("FERRY_S3_ENDPOINT")
	case "gs":
		raw, upstream = gcsURL(t, "ferry-faults"), "http://"+os.Getenv("STORAGE_EMULATOR_HOST")
	case "azblob":
		raw, upstream = azureURL(t, "ferry-faults"), "http://"+os.Getenv("AZURE_STORAGE_DOMAIN")
	}
	fp, err := faultproxy.New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fp.Close)
	direct = openURL(t, raw)
	u, _ := url.Parse(raw)
	q := u.Query()
	switch kind {
	case "s3":
		q.Set("endpoint", fp.URL())
	case "gs":
		// The GCS client reads the emulator address when a bucket is
		// opened.
		fp.SetRewriteHost(true) // fake-gcs-server routes by Host
		old := os.Getenv("STORAGE_EMULATOR_HOST")
		os.Setenv("STORAGE_EMULATOR_HOST", fp.Addr())
		defer os.Setenv("STORAGE_EMULATOR_HOST", old)
	case "azblob":
		q.Set("domain", fp.Addr())
	}
	u.RawQuery = q.Encode()
	// The GCS client retries connection errors until its context ends, so
	// the timeout bounds how long a "down" case takes.
	via = payloadstore.Wrap(openURL(t, u.String()), fastPolicyFor(8*time.Second))
	return direct, via, fp
}

// The faults of the S3 tests above, for every cloud store: down during
// upload and download, and throttling.
func TestCloudFaultsEveryStore(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []string{"s3", "gs", "azblob"} {
		t.Run(kind, func(t *testing.T) {
			direct, via, fp := viaProxyFor(t, kind)
			data := randPayload(t, 256<<10)

			fp.Set(faultproxy.Down, -1)
			if _, err := payloadstore.PublishBytes(ctx, via, "orders", data); !payloadstore.IsRetryable(err) {
				t.Fatalf("publish while down: %v, want a retryable error", err)
			}
			fp.Set(faultproxy.Pass, -1)
			if left := listAll(t, direct, "orders"); len(left) != 0 {
				t.Fatalf("a failed upload left objects: %v", left)
			}

			resp, err := payloadstore.PublishBytes(ctx, direct, "orders", data)
			if err != nil {
				t.Fatal(err)
			}
			fp.Set(faultproxy.Down, -1)
			_, err = payloadstore.DownloadBytes(ctx, via, resp.FullPayloadPath)
			if err == nil || errors.Is(err, payloadstore.ErrPayloadNotFound) || !payloadstore.IsRetryable(err) {
				t.Fatalf("download while down: %v, want retryable and not ErrPayloadNotFound", err)
			}

			fp.SetThrottleStatus(http.StatusServiceUnavailable)
			fp.Set(faultproxy.Throttle, 2)
			got, err := payloadstore.DownloadBytes(ctx, via, resp.FullPayloadPath)
			if err != nil || !bytes.Equal(got, data) {
				for _, r := range fp.Requests() {
					t.Logf("%v %s %s", r.Mode, r.Method, r.Path)
				}
				t.Fatalf("download after 2 throttled requests: %v", err)
			}
			if n := fp.Count(faultproxy.Throttle); n != 2 {
				t.Fatalf("%d requests throttled, want 2", n)
			}
			fp.SetThrottleStatus(http.StatusTooManyRequests)
			fp.Set(faultproxy.Throttle, 2)
			resp2, err := payloadstore.PublishBytes(ctx, via, "orders", data)
			if err != nil {
				t.Fatalf("publish after 2 throttled (429) requests: %v", err)
			}
			if got, err := payloadstore.DownloadBytes(ctx, direct, resp2.FullPayloadPath); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("object published through throttling: %v", err)
			}
		})
	}
}

// goneBody yields n bytes of data, then fails (a client gone mid-value).
type goneBody struct {
	r io.Reader
}

func (f *goneBody) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errors.New("client went away")
	}
	return n, err
}

// Found by a fault-hunting helper: a value streamed from a client that
// fails mid-upload (the proxy's Shutdown drains the connection) leaves its
// multipart upload to a background abort; the proxy then closed the store
// and exited before that abort ran, and the parts stayed (invisible, but
// billed). Close waits for the aborts in flight.
func TestS3CloseWaitsForAbort(t *testing.T) {
	ctx := context.Background()
	rawURL := storetest.S3URL(t, "ferry-faults")
	s, err := payloadstore.Open(ctx, rawURL, payloadstore.Options{PartSizeBytes: 5 << 20, UploadConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	data := randPayload(t, 12<<20)
	_, err = s.Publish(ctx, "orders", payloadstore.OncePayload(&goneBody{r: bytes.NewReader(data)}, 20<<20))
	if err == nil {
		t.Fatal("a publish whose body failed succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(rawURL)
	prefix := strings.Trim(u.Path, "/") + "/"
	out, err := storetest.S3Client(t).ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(u.Host), Prefix: aws.String(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Uploads) != 0 {
		t.Fatalf("%d multipart uploads left under %s once the store was closed after a failed publish (%v)", len(out.Uploads), prefix, err)
	}
}
