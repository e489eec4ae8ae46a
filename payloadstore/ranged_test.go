//go:build !ferry_nocloud

package payloadstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/shaper"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

// rangedOpts: 1 MiB ranges, 3 in flight, so a few MiB take several ranges.
var rangedOpts = payloadstore.Options{PartSizeBytes: 5 << 20, UploadConcurrency: 2, DownloadPartBytes: 1 << 20, DownloadConcurrency: 3}

// Every cloud store reads objects of every size around a range boundary
// byte for byte: empty, one byte, exactly one range, one range and a byte,
// several ranges.
func TestRangedDownloadEveryStore(t *testing.T) {
	ctx := context.Background()
	for name, mk := range map[string]func(testing.TB, string) string{"s3": s3URL, "gs": gcsURL, "azblob": azureURL} {
		t.Run(name, func(t *testing.T) {
			s, err := payloadstore.Open(ctx, mk(t, "ferry-conformance"), rangedOpts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for _, n := range []int{0, 1, 1 << 20, 1<<20 + 1, 5<<20 + 12345} {
				data := randPayload(t, n)
				resp, err := payloadstore.PublishBytes(ctx, s, "orders", data)
				if err != nil {
					t.Fatalf("publish %d bytes: %v", n, err)
				}
				got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("download of %d bytes: got %d (%v)", n, len(got), err)
				}
			}
		})
	}
}

// The requests of a ranged download through the real S3 server: one GET
// per range; an object of at most one range is one GET; a missing object
// is ErrPayloadNotFound, not retryable.
func TestS3RangedDownloadRequests(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-faults")
	for _, n := range []int{1 << 20, 5<<20 + 1} {
		data := randPayload(t, n)
		resp, err := payloadstore.PublishBytes(ctx, openWith(t, direct, rangedOpts), "orders", data)
		if err != nil {
			t.Fatal(err)
		}
		s := openWith(t, via, rangedOpts)
		before := len(fp.Requests())
		got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("download of %d bytes: got %d (%v)", n, len(got), err)
		}
		want := (n + 1<<20 - 1) / (1 << 20)
		if gets := len(fp.Requests()) - before; gets != want {
			t.Fatalf("download of %d bytes with 1 MiB ranges made %d requests, want %d", n, gets, want)
		}
	}
	s := openWith(t, via, rangedOpts)
	ops, _ := payloadstore.Objects(s)
	key, err := payloadstore.ObjectKey("orders", uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	missing := ops.Root().Path(key)
	if _, err := payloadstore.DownloadBytes(ctx, s, missing); !errors.Is(err, payloadstore.ErrPayloadNotFound) || payloadstore.IsRetryable(err) {
		t.Fatalf("ranged download of a missing object: %v, want ErrPayloadNotFound, not retryable", err)
	}
}

// A range cut off mid-body is asked for again from the byte it reached,
// and the download yields the exact bytes.
func TestS3RangedDownloadResumesAfterCut(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-faults")
	data := randPayload(t, 4<<20+7)
	resp, err := payloadstore.PublishBytes(ctx, openWith(t, direct, rangedOpts), "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	s := openWith(t, via, rangedOpts)
	fp.SetCutAfter(300 << 10)
	fp.Set(faultproxy.CutBody, 2)
	got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download with two ranges cut after 300 KiB: %d bytes, %v; want the %d original bytes", len(got), err, len(data))
	}
	if n, want := len(fp.Requests()), 5+2; n < want {
		t.Fatalf("saw %d requests, want at least %d (5 ranges and 2 resumes)", n, want)
	}
}

// The download knobs are checked at Open.
func TestDownloadOptionsAtLimits(t *testing.T) {
	ctx := context.Background()
	raw := s3URL(t, "ferry-conformance")
	for _, o := range []payloadstore.Options{{DownloadPartBytes: 256<<10 - 1}, {DownloadConcurrency: -1}} {
		_, err := payloadstore.Open(ctx, raw, o)
		if !errors.Is(err, payloadstore.ErrInvalidConfig) {
			t.Fatalf("Open with %+v: %v, want ErrInvalidConfig", o, err)
		}
	}
	s := openWith(t, raw, payloadstore.Options{DownloadPartBytes: 256 << 10, DownloadConcurrency: 1})
	data := randPayload(t, 600<<10)
	resp, err := payloadstore.PublishBytes(ctx, s, "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download at the smallest range and one GET: %d bytes, %v", len(got), err)
	}
}

func openWith(t *testing.T, raw string, o payloadstore.Options) payloadstore.PayloadStore {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), raw, o)
	if err != nil {
		t.Fatalf("Open %s: %v", raw, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The ranged GETs of downloads reuse the client's connections: through
// internal/shaper (which counts the connections it accepts) two downloads of
// five ranges each, two in flight, open no more connections than are in
// flight at once (plus the start-up check's). The S3 server must keep
// connections open (versitygw --keep-alive, scripts/object-stores).
func TestS3RangedDownloadReusesConnections(t *testing.T) {
	ctx := context.Background()
	direct := s3URL(t, "ferry-conformance")
	sh, err := shaper.Start(shaper.Config{Upstream: strings.TrimPrefix(os.Getenv("FERRY_S3_ENDPOINT"), "http://"), BytesPerSecond: -1, Latency: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	u, _ := url.Parse(direct)
	q := u.Query()
	q.Set("endpoint", "http://"+sh.Addr())
	u.RawQuery = q.Encode()
	o := rangedOpts
	o.DownloadConcurrency = 2
	data := randPayload(t, 5<<20)
	resp, err := payloadstore.PublishBytes(ctx, openWith(t, direct, o), "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	s := openWith(t, u.String(), o)
	for range 2 {
		got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("download: %d bytes, %v", len(got), err)
		}
	}
	if n := sh.Accepted(); n > 4 {
		t.Fatalf("10 ranged GETs, 2 in flight, opened %d connections, want at most 4 (reused; does the S3 server send Connection: close?)", n)
	}
}

// A streamed download (WithStreaming) through the real S3 server: opening
// it makes one GET (the object's size; a missing object fails here), and
// no other request is made before its first Read, however long it waits;
// then one GET per range, the first asked for again, and the exact bytes.
func TestS3StreamedDownloadWaitsForRead(t *testing.T) {
	ctx := context.Background()
	direct, via, fp := storetest.S3URLViaFaultProxy(t, "ferry-faults")
	const n = 5<<20 + 1
	data := randPayload(t, n)
	resp, err := payloadstore.PublishBytes(ctx, openWith(t, direct, rangedOpts), "orders", data)
	if err != nil {
		t.Fatal(err)
	}
	s := openWith(t, via, rangedOpts)
	before := len(fp.Requests())
	// 4 MiB of read-ahead: 1 MiB ranges (rangedOpts), 3 in flight.
	rc, err := s.Download(payloadstore.WithStreaming(ctx, 4<<20), resp.FullPayloadPath)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	time.Sleep(300 * time.Millisecond) // a range started eagerly would show by now
	if gets := len(fp.Requests()) - before; gets != 1 {
		t.Fatalf("a streamed download opened, not read: %d requests, want 1", gets)
	}
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("streamed download of %d bytes: got %d (%v)", n, len(got), err)
	}
	if gets, want := len(fp.Requests())-before, 1+(n+1<<20-1)/(1<<20); gets != want {
		t.Fatalf("streamed download of %d bytes with 1 MiB ranges made %d requests, want %d", n, gets, want)
	}
}
