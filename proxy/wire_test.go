package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// encodeRequest builds a request frame the way a client does: header v1 or
// v2 (by kmsg's flexibility of req at its version), then the body.
func encodeRequest(req kmsg.Request, corr int32, clientID *string) []byte {
	b := make([]byte, 4, 128)
	b = kbin.AppendInt16(b, req.Key())
	b = kbin.AppendInt16(b, req.GetVersion())
	b = kbin.AppendInt32(b, corr)
	b = kbin.AppendNullableString(b, clientID)
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

func TestReadFrame(t *testing.T) {
	msg := []byte("hello kafka")
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(msg)))
	frame = append(frame, msg...)
	two := append(append([]byte{}, frame...), frame...)
	r := bufio.NewReader(bytes.NewReader(two))
	for i := range 2 {
		got, err := ReadFrame(r, 100)
		if err != nil || !bytes.Equal(got, frame) {
			t.Fatalf("frame %d = %q, %v; want %q", i, got, err, frame)
		}
	}
	if _, err := ReadFrame(r, 100); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}

	cases := []struct {
		name string
		in   []byte
		max  int32
		want error
	}{
		{"size at the limit", frame, int32(len(msg)), nil},
		{"size one over the limit", frame, int32(len(msg)) - 1, ErrFrameTooLarge},
		{"negative size", []byte{0xff, 0xff, 0xff, 0xfe, 1}, 100, ErrNegativeSize},
		{"truncated prefix", frame[:3], 100, io.ErrUnexpectedEOF},
		{"truncated body", frame[:len(frame)-1], 100, io.ErrUnexpectedEOF},
		{"empty frame", []byte{0, 0, 0, 0}, 100, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ReadFrame(bufio.NewReader(bytes.NewReader(c.in)), c.max)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if err == nil && !bytes.Equal(got, c.in) {
				t.Fatalf("frame = %x, want %x", got, c.in)
			}
		})
	}
}

// A size prefix over the limit must not make the reader allocate or read
// the announced size: it fails right after the prefix.
func TestReadFrameOverLimitReadsOnlyThePrefix(t *testing.T) {
	in := binary.BigEndian.AppendUint32(nil, 1<<31-1)
	in = append(in, "rest"...)
	br := bufio.NewReaderSize(bytes.NewReader(in), 16)
	if _, err := ReadFrame(br, DefaultMaxRequestBytes); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want ErrFrameTooLarge", err)
	}
}

func TestParseRequestHeader(t *testing.T) {
	id := "ferry-test"
	for _, tc := range []struct {
		req      kmsg.Request
		flexible bool
	}{
		{func() kmsg.Request { r := kmsg.NewPtrMetadataRequest(); r.Version = 4; return r }(), false},
		{func() kmsg.Request { r := kmsg.NewPtrMetadataRequest(); r.Version = 12; return r }(), true},
		{func() kmsg.Request { r := kmsg.NewPtrApiVersionsRequest(); r.Version = 3; return r }(), true},
		{func() kmsg.Request { r := kmsg.NewPtrProduceRequest(); r.Version = 7; r.Acks = -1; return r }(), false},
	} {
		frame := encodeRequest(tc.req, 77, &id)
		h, err := ParseRequestHeader(frame[4:])
		if err != nil {
			t.Fatalf("%s v%d: %v", kmsg.NameForKey(tc.req.Key()), tc.req.GetVersion(), err)
		}
		wantLen := 2 + 2 + 4 + 2 + len(id)
		if tc.flexible {
			wantLen++
		}
		if h.Key != tc.req.Key() || h.Version != tc.req.GetVersion() || h.CorrelationID != 77 ||
			h.ClientID == nil || *h.ClientID != id || h.Flexible != tc.flexible || h.Len != wantLen {
			t.Fatalf("header = %+v (client id %v), want key %d v%d corr 77 flexible %v len %d",
				h, h.ClientID, tc.req.Key(), tc.req.GetVersion(), tc.flexible, wantLen)
		}
		// The body kmsg reads back from h.Len is the request itself.
		back := kmsg.RequestForKey(h.Key)
		back.SetVersion(h.Version)
		if err := back.ReadFrom(frame[4+h.Len:]); err != nil {
			t.Fatalf("body at h.Len does not decode: %v", err)
		}
	}

	// A null client id is allowed.
	frame := encodeRequest(kmsg.NewPtrMetadataRequest(), 1, nil)
	if h, err := ParseRequestHeader(frame[4:]); err != nil || h.ClientID != nil {
		t.Fatalf("null client id: %+v, %v", h, err)
	}

	bad := func(name string, msg []byte, want error) {
		t.Helper()
		if _, err := ParseRequestHeader(msg); !errors.Is(err, want) {
			t.Errorf("%s: err = %v, want %v", name, err, want)
		}
	}
	bad("empty", nil, ErrTruncatedHeader)
	bad("7 bytes", []byte{0, 3, 0, 4, 0, 0, 0}, ErrTruncatedHeader)
	bad("client id longer than the message", []byte{0, 3, 0, 4, 0, 0, 0, 1, 0, 9, 'a'}, ErrTruncatedHeader)
	bad("unknown key", []byte{0x7f, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff}, ErrUnknownKey)
	bad("negative key", []byte{0xff, 0xff, 0, 0, 0, 0, 0, 1, 0xff, 0xff}, ErrUnknownKey)
	maxMeta, _ := CodecMaxVersion(3)
	bad("version above kmsg's", []byte{0, 3, 0, byte(maxMeta + 1), 0, 0, 0, 1, 0xff, 0xff}, ErrUnsupportedVersion)
	bad("negative version", []byte{0, 3, 0xff, 0xff, 0, 0, 0, 1, 0xff, 0xff}, ErrUnsupportedVersion)
}

func TestProduceAcks(t *testing.T) {
	txn := "txn-1"
	for _, v := range []int16{2, 3, 8, 9, 11} {
		for _, acks := range []int16{0, 1, -1} {
			req := kmsg.NewPtrProduceRequest()
			req.Version = v
			req.Acks = acks
			req.TransactionID = &txn
			frame := encodeRequest(req, 5, nil)
			h, err := ParseRequestHeader(frame[4:])
			if err != nil {
				t.Fatal(err)
			}
			got, err := produceAcks(frame[4+h.Len:], h.Version, h.Flexible)
			if err != nil || got != acks {
				t.Fatalf("Produce v%d acks %d: got %d, %v", v, acks, got, err)
			}
		}
	}
	if _, err := produceAcks([]byte{0, 5}, 3, false); err == nil {
		t.Fatal("truncated Produce body: no error")
	}
}

func TestIntersectApiVersions(t *testing.T) {
	resp := kmsg.NewPtrApiVersionsResponse()
	add := func(key, lo, hi int16) {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = key, lo, hi
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	metaMax, _ := CodecMaxVersion(3)
	add(0, 3, 5)                     // Produce: inside kmsg's range, kept as is
	add(3, 0, metaMax+5)             // Metadata: capped at kmsg's max
	add(9999, 0, 3)                  // unknown key: dropped
	add(1, metaMax+100, metaMax+200) // Fetch range entirely above kmsg: dropped
	IntersectApiVersions(resp)
	got := map[int16][2]int16{}
	for _, k := range resp.ApiKeys {
		got[k.ApiKey] = [2]int16{k.MinVersion, k.MaxVersion}
	}
	want := map[int16][2]int16{0: {3, 5}, 3: {0, metaMax}}
	if len(got) != len(want) || got[0] != want[0] || got[3] != want[3] {
		t.Fatalf("intersection = %v, want %v", got, want)
	}
}

func TestUnsupportedApiVersionsResponse(t *testing.T) {
	frame := unsupportedApiVersionsResponse(42)
	if int(binary.BigEndian.Uint32(frame)) != len(frame)-4 {
		t.Fatal("size prefix does not match")
	}
	corr, n, err := parseResponseHeader(frame[4:], ResponseHeaderFlexible(apiVersionsKey, 3))
	if err != nil || corr != 42 || n != 4 {
		t.Fatalf("header: corr %d len %d err %v", corr, n, err)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	if err := resp.ReadFrom(frame[4+n:]); err != nil {
		t.Fatal(err)
	}
	maxV, _ := CodecMaxVersion(apiVersionsKey)
	if resp.ErrorCode != kerr.UnsupportedVersion.Code || len(resp.ApiKeys) != 1 ||
		resp.ApiKeys[0].ApiKey != apiVersionsKey || resp.ApiKeys[0].MaxVersion != maxV {
		t.Fatalf("response = %+v", resp)
	}
}

func TestRewriteApiVersionsBrokerUnsupported(t *testing.T) {
	// A broker that does not know the version answers v0 with error 35;
	// the proxy must decode that as v0, not at the request's version.
	frame := unsupportedApiVersionsResponse(1)
	body, err := rewriteApiVersions(frame[8:], 3)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, frame[8:]) {
		t.Fatalf("re-encoded %x, want %x", body, frame[8:])
	}
}

func FuzzReadFrame(f *testing.F) {
	id := "c"
	f.Add(encodeRequest(kmsg.NewPtrMetadataRequest(), 1, &id))
	p := kmsg.NewPtrProduceRequest()
	p.Version = 9
	f.Add(encodeRequest(p, 2, nil))
	// A header and acks past a short head read (peekRequest).
	txn, long := strings.Repeat("t", 300), strings.Repeat("c", 300)
	p.TransactionID = &txn
	f.Add(encodeRequest(p, 3, &long))
	f.Add([]byte{0, 0, 0, 4, 0, 18, 0, 9})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReader(bytes.NewReader(in))
		for {
			frame, err := ReadFrame(r, 1<<16)
			if err != nil {
				return
			}
			if int(binary.BigEndian.Uint32(frame)) != len(frame)-4 {
				t.Fatalf("frame length %d disagrees with its prefix", len(frame))
			}
			h, err := ParseRequestHeader(frame[4:])
			checkHeadComplete(t, frame[4:], h, err)
			if err != nil {
				continue
			}
			if h.Len < 10 || h.Len > len(frame)-4 {
				t.Fatalf("header length %d outside [10, %d]", h.Len, len(frame)-4)
			}
			if h.Key == 0 {
				_, _ = produceAcks(frame[4+h.Len:], h.Version, h.Flexible)
			}
			if needsRewrite(h.Key, h.Version) || h.Key == apiVersionsKey {
				// The response decoders must not panic on any bytes either.
				_, _, _ = RewriteResponse(h.Key, h.Version, frame[4+h.Len:], func(n int32, _ string, _ int32) (string, int32, error) {
					return "proxy", 1, nil
				})
				_, _ = rewriteApiVersions(frame[4+h.Len:], h.Version)
			}
		}
	})
}

// checkHeadComplete: a head of msg that requestHeadComplete accepts (the
// short read of peekRequest) decides the request as the whole message does:
// the same header, or the same refusal, and a Produce request's acks.
func checkHeadComplete(t *testing.T, msg []byte, h RequestHeader, err error) {
	t.Helper()
	for _, k := range []int{0, 3, 8, 20, headRead - 4, len(msg)} {
		head := msg[:min(k, len(msg))]
		if !requestHeadComplete(head) {
			continue
		}
		hh, herr := ParseRequestHeader(head)
		if herr != nil {
			for _, e := range []error{ErrUnknownKey, ErrUnsupportedVersion} {
				if errors.Is(herr, e) != errors.Is(err, e) {
					t.Fatalf("a %d-byte head: %v; the whole message: %v", len(head), herr, err)
				}
			}
			continue
		}
		if err != nil || hh.Key != h.Key || hh.Version != h.Version || hh.CorrelationID != h.CorrelationID ||
			hh.Flexible != h.Flexible || hh.Len != h.Len || (hh.ClientID == nil) != (h.ClientID == nil) ||
			hh.ClientID != nil && *hh.ClientID != *h.ClientID {
			t.Fatalf("a %d-byte head parses as %+v; the whole message as %+v, %v", len(head), hh, h, err)
		}
		if h.Key == keyProduce {
			ha, herr := produceAcks(head[hh.Len:], hh.Version, hh.Flexible)
			a, aerr := produceAcks(msg[h.Len:], h.Version, h.Flexible)
			if herr != nil || aerr != nil || ha != a {
				t.Fatalf("a %d-byte head: acks %d, %v; the whole message: %d, %v", len(head), ha, herr, a, aerr)
			}
		}
	}
}

func TestReadFrameReusesBuffer(t *testing.T) {
	in := []byte{0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 1, 'z'}
	r := bufio.NewReader(bytes.NewReader(in))
	buf := make([]byte, 0, 16)
	f1, err := readFrame(r, 100, buf)
	if err != nil || string(f1[4:]) != "abc" || &f1[0] != &buf[:1][0] {
		t.Fatalf("first frame %q, %v (reused: %v)", f1, err, err == nil && &f1[0] == &buf[:1][0])
	}
	f2, err := readFrame(r, 100, nil)
	if err != nil || string(f2[4:]) != "z" {
		t.Fatalf("second frame %q, %v", f2, err)
	}
	// Too small a buffer is not used.
	r = bufio.NewReader(bytes.NewReader(in))
	small := make([]byte, 0, 2)
	f3, err := readFrame(r, 100, small)
	if err != nil || string(f3[4:]) != "abc" || cap(f3) < 7 {
		t.Fatalf("frame with a small buffer %q, %v", f3, err)
	}
}
