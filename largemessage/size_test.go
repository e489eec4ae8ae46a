package largemessage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kmsgRecord encodes key, value and headers as the only record of a magic v2
// batch with kmsg: the Length field is found by encoding once with Length 0
// (a one-byte varint) and taking the rest.
func kmsgRecord(t testing.TB, key, value []byte, headers []kgo.RecordHeader) []byte {
	t.Helper()
	r := kmsg.Record{Key: key, Value: value}
	for _, h := range headers {
		r.Headers = append(r.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
	}
	r.Length = int32(len(r.AppendTo(nil)) - 1)
	b := r.AppendTo(nil)
	// Decoding gives the record back, so the Length is right.
	var back kmsg.Record
	if err := back.ReadFrom(b); err != nil {
		t.Fatalf("kmsg cannot read the record it encoded: %v", err)
	}
	if !bytes.Equal(back.Key, key) || !bytes.Equal(back.Value, value) || len(back.Headers) != len(headers) || (key == nil) != (back.Key == nil) || (value == nil) != (back.Value == nil) {
		t.Fatalf("kmsg round trip changed the record")
	}
	return b
}

func TestRecordLenMatchesKmsg(t *testing.T) {
	sized := func(n int) []byte { return bytes.Repeat([]byte{'v'}, n) }
	many := make([]kgo.RecordHeader, 200)
	for i := range many {
		many[i] = kgo.RecordHeader{Key: fmt.Sprintf("h%03d", i), Value: sized(i)}
	}
	cases := []struct {
		name       string
		key, value []byte
		headers    []kgo.RecordHeader
	}{
		{"all nil", nil, nil, nil},
		{"empty key and value", []byte{}, []byte{}, nil},
		{"nil key", nil, []byte("v"), nil},
		{"tombstone", []byte("k"), nil, nil},
		{"header with nil value", []byte("k"), []byte("v"), []kgo.RecordHeader{{Key: "h", Value: nil}}},
		{"header with empty key", nil, []byte("v"), []kgo.RecordHeader{{Key: "", Value: []byte("x")}}},
		{"ferry headers", []byte("order-42"), sized(99), []kgo.RecordHeader{
			{Key: HeaderLargeMessage, Value: []byte("true")},
			{Key: HeaderPayloadSize, Value: []byte("5242880")},
			{Key: HeaderPayloadSHA256, Value: bytes.Repeat([]byte("ab"), 32)},
		}},
		{"200 headers", []byte("k"), sized(10), many},
	}
	// Lengths either side of every varint width boundary, for the value, the
	// key, a header value, and the record length itself.
	for _, n := range []int{63, 64, 65, 8191, 8192, 8193, 1<<20 - 20, 1 << 20, 1<<21 - 1, 1 << 21, 3 << 20} {
		cases = append(cases,
			struct {
				name       string
				key, value []byte
				headers    []kgo.RecordHeader
			}{fmt.Sprintf("value %d", n), []byte("key"), sized(n), nil},
			struct {
				name       string
				key, value []byte
				headers    []kgo.RecordHeader
			}{fmt.Sprintf("key %d", n), sized(n), nil, nil},
		)
		if n < 1<<20 {
			cases = append(cases, struct {
				name       string
				key, value []byte
				headers    []kgo.RecordHeader
			}{fmt.Sprintf("header %d", n), nil, []byte("v"), []kgo.RecordHeader{{Key: "big", Value: sized(n)}}})
		}
	}
	// Sweep value lengths so that the record's own length varint crosses
	// its 1→2 byte (64) and 2→3 byte (8192) boundaries.
	for n := 40; n < 80; n++ {
		cases = append(cases, struct {
			name       string
			key, value []byte
			headers    []kgo.RecordHeader
		}{fmt.Sprintf("sweep %d", n), nil, sized(n), nil})
	}
	for n := 8170; n < 8200; n++ {
		cases = append(cases, struct {
			name       string
			key, value []byte
			headers    []kgo.RecordHeader
		}{fmt.Sprintf("sweep %d", n), nil, sized(n), nil})
	}
	for _, c := range cases {
		want := len(kmsgRecord(t, c.key, c.value, c.headers))
		if got := RecordLen(c.key, c.value, c.headers); got != int64(want) {
			t.Errorf("%s: RecordLen = %d, kmsg encodes %d bytes", c.name, got, want)
		}
		// appendRecord, which Fits compresses, must be those bytes.
		if got := appendRecord(nil, c.key, c.value, c.headers); !bytes.Equal(got, kmsgRecord(t, c.key, c.value, c.headers)) {
			t.Errorf("%s: appendRecord differs from kmsg's encoding", c.name)
		}
	}
}

// sizeInputs are the inputs the codecs are measured on.
func sizeInputs() map[string]func(n int) []byte {
	return map[string]func(n int) []byte{
		"random": func(n int) []byte {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			return b
		},
		"zeros": func(n int) []byte { return make([]byte, n) },
		"text": func(n int) []byte {
			words := strings.Fields("the quick brown fox jumps over a lazy dog while ferry carries large kafka messages to the payload store and back again")
			r := rand.New(rand.NewPCG(uint64(n), 2))
			var b bytes.Buffer
			for b.Len() < n {
				b.WriteString(words[r.IntN(len(words))])
				b.WriteByte(' ')
			}
			return b.Bytes()[:n]
		},
	}
}

var sizeCodecs = []Codec{
	{Type: "gzip"},
	{Type: "gzip", Level: 1},
	{Type: "gzip", Level: 9},
	{Type: "snappy"},
	{Type: "lz4"},
	{Type: "zstd"},
	{Type: "zstd", Level: int(zstd.SpeedFastest)},
	{Type: "zstd", Level: int(zstd.SpeedBestCompression)},
}

// kgoCompressedLen is the length franz-go's own compressor gives src.
func kgoCompressedLen(t testing.TB, c Codec, src []byte) int64 {
	t.Helper()
	n := kgoLen(c, src)
	if n < 0 {
		t.Fatalf("franz-go failed to compress with %+v", c)
	}
	return n
}

// kgoLen is kgoCompressedLen without a testing.TB (for goroutines); -1 on
// failure.
func kgoLen(c Codec, src []byte) int64 {
	comp, err := kgo.DefaultCompressor(c.KgoCodec())
	if err != nil {
		return -1
	}
	if comp == nil {
		return int64(len(src))
	}
	out, used := comp.Compress(new(bytes.Buffer), src)
	if out == nil || used == kgo.CodecError {
		return -1
	}
	return int64(len(out))
}

func TestCompressedLenMatchesFranzGo(t *testing.T) {
	sizes := []int{1, 100, 4096, 64<<10 + 7, 1 << 20, 2 << 20}
	inputs := sizeInputs()
	// Build every input once, shared read-only across the parallel subtests.
	data := map[string][]byte{}
	for name, gen := range inputs {
		for _, n := range sizes {
			data[fmt.Sprintf("%s/%d", name, n)] = gen(n)
		}
	}
	for _, c := range sizeCodecs {
		t.Run(fmt.Sprintf("%s-%d", c.Type, c.Level), func(t *testing.T) {
			t.Parallel()
			for name, src := range data {
				want := kgoCompressedLen(t, c, src)
				got, err := c.CompressedLen(src, 0)
				if err != nil {
					t.Fatalf("%s: CompressedLen: %v", name, err)
				}
				if got != want {
					t.Errorf("%s: CompressedLen = %d, franz-go compresses to %d", name, got, want)
				}
			}
		})
	}
	t.Run("none", func(t *testing.T) {
		c := Codec{Type: "none"}
		if comp, _ := kgo.DefaultCompressor(c.KgoCodec()); comp != nil {
			t.Fatal("codec none gives franz-go a compressor")
		}
		for name, src := range data {
			if got, err := c.CompressedLen(src, 0); err != nil || got != int64(len(src)) {
				t.Errorf("%s: CompressedLen = %d, %v; want the input length", name, got, err)
			}
		}
	})
}

func TestCheckAgainstClient(t *testing.T) {
	for _, c := range sizeCodecs {
		comp, err := kgo.DefaultCompressor(c.KgoCodec())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.checkAgainstClient(comp); err != nil {
			t.Errorf("%+v against its own KgoCodec: %v", c, err)
		}
	}
	// A different level is noticed.
	comp, _ := kgo.DefaultCompressor(kgo.GzipCompression().WithLevel(1))
	if err := (Codec{Type: "gzip", Level: 9}).checkAgainstClient(comp); err == nil {
		t.Error("gzip level 9 passed against a level-1 client")
	}
	comp, _ = kgo.DefaultCompressor(kgo.ZstdCompression())
	if err := (Codec{Type: "none"}).checkAgainstClient(comp); err == nil {
		t.Error("codec none passed against a zstd client")
	}
}

func TestCompressedLenStopsEarly(t *testing.T) {
	src := sizeInputs()["random"](2 << 20)
	for _, c := range []Codec{{Type: "gzip"}, {Type: "gzip", Level: 1}, {Type: "lz4"}} {
		full, err := c.CompressedLen(src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, limit := range []int64{64 << 10, 1 << 20, full - 1} {
			n, err := c.CompressedLen(src, limit)
			if !errors.Is(err, errOver) {
				t.Errorf("%+v limit %d (full %d): err %v, want errOver", c, limit, full, err)
			}
			if n <= limit {
				t.Errorf("%+v limit %d: stopped at %d, not over the limit", c, limit, n)
			}
		}
		// At exactly the full length, or above, there is no error.
		for _, limit := range []int64{full, full + 1} {
			if n, err := c.CompressedLen(src, limit); err != nil || n != full {
				t.Errorf("%+v limit %d: %d, %v; want %d, nil", c, limit, n, err, full)
			}
		}
	}
	// Snappy and zstd are block encoders: the limit does not stop them, they
	// measure the whole input.
	for _, c := range []Codec{{Type: "snappy"}, {Type: "zstd"}} {
		full, _ := c.CompressedLen(src, 0)
		if n, err := c.CompressedLen(src, 1024); err != nil || n != full {
			t.Errorf("%+v with a limit: %d, %v; want %d, nil", c, n, err, full)
		}
	}
}

// textValue is a compressible value of n bytes.
func textValue(n int) []byte { return sizeInputs()["text"](n) }

func TestFits(t *testing.T) {
	const (
		threshold = 1048588 - 61 // Kafka's default max.message.bytes less the v2 batch header
		large     = 64 << 20
	)
	lim := Limits{Threshold: threshold, MaxMessageBytes: 1048588, ClientBatchMaxBytes: large}
	key := []byte("k")
	hs := []kgo.RecordHeader{{Key: "app", Value: []byte("1")}}

	t.Run("small record fits uncompressed", func(t *testing.T) {
		for _, c := range []Codec{{Type: "none"}, {Type: ""}, {Type: "zstd"}, {Type: "gzip"}} {
			ok, err := c.Fits(lim, key, sizeInputs()["random"](1000), hs)
			if err != nil || !ok {
				t.Errorf("%+v: a 1000-byte record: fits=%v, %v", c, ok, err)
			}
		}
	})

	value := textValue(1100 * 1000) // 1.1 MB of text, compresses well
	if RecordLen(key, value, hs) <= threshold {
		t.Fatal("test value is not over the threshold")
	}
	t.Run("compressible 1.1 MB fits under zstd", func(t *testing.T) {
		ok, err := Codec{Type: "zstd"}.Fits(lim, key, value, hs)
		if err != nil || !ok {
			t.Fatalf("fits=%v, %v", ok, err)
		}
	})
	t.Run("same record does not fit uncompressed", func(t *testing.T) {
		for _, c := range []Codec{{Type: "none"}, {Type: ""}} {
			ok, err := c.Fits(lim, key, value, hs)
			if err != nil || ok {
				t.Fatalf("%+v: fits=%v, %v", c, ok, err)
			}
		}
	})
	t.Run("random 1.1 MB does not fit under any codec", func(t *testing.T) {
		random := sizeInputs()["random"](1100 * 1000)
		for _, c := range sizeCodecs {
			ok, err := c.Fits(lim, key, random, hs)
			if err != nil || ok {
				t.Errorf("%+v: fits=%v, %v", c, ok, err)
			}
		}
	})
	t.Run("over the client cap never fits", func(t *testing.T) {
		// franz-go's default ProducerBatchMaxBytes; the record compresses to
		// almost nothing, but the client caps the uncompressed batch.
		capped := Limits{Threshold: threshold, MaxMessageBytes: 1048588, ClientBatchMaxBytes: 1000012}
		zeros := make([]byte, 1100*1000)
		for _, c := range sizeCodecs {
			ok, err := c.Fits(capped, key, zeros, hs)
			if err != nil || ok {
				t.Errorf("%+v: fits=%v, %v", c, ok, err)
			}
			if n := kgoCompressedLen(t, c, kmsgRecord(t, key, zeros, hs)); n > 64<<10 {
				t.Errorf("%+v: zeros compress to %d bytes; the case is meant to be compressible", c, n)
			}
		}
	})

	// The answer is exact: with the threshold at the record's compressed
	// length as franz-go measures it, it fits; one byte less, it does not.
	t.Run("exact boundary", func(t *testing.T) {
		rec := kmsgRecord(t, key, value, hs)
		var wg sync.WaitGroup
		for _, c := range sizeCodecs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := kgoLen(c, rec)
				if n < 0 {
					t.Errorf("%+v: franz-go failed to compress", c)
					return
				}
				at := Limits{Threshold: n, MaxMessageBytes: n + 61, ClientBatchMaxBytes: large}
				if ok, err := c.Fits(at, key, value, hs); err != nil || !ok {
					t.Errorf("%+v: threshold = compressed length %d: fits=%v, %v", c, n, ok, err)
				}
				at.Threshold = n - 1
				if ok, err := c.Fits(at, key, value, hs); err != nil || ok {
					t.Errorf("%+v: threshold = compressed length - 1: fits=%v, %v", c, ok, err)
				}
			}()
		}
		wg.Wait()
		// Uncompressed: the boundary is RecordLen.
		u := RecordLen(key, value, hs)
		if ok, _ := (Codec{Type: "none"}).Fits(Limits{Threshold: u}, key, value, hs); !ok {
			t.Error("none: threshold = RecordLen does not fit")
		}
		if ok, _ := (Codec{Type: "none"}).Fits(Limits{Threshold: u - 1}, key, value, hs); ok {
			t.Error("none: threshold = RecordLen - 1 fits")
		}
	})
}

func TestDeriveLimits(t *testing.T) {
	// The v2 record batch header, measured from kmsg rather than assumed:
	// every field of an empty batch.
	batchHeader := int64(len((&kmsg.RecordBatch{}).AppendTo(nil)))
	if BatchOverhead != batchHeader {
		t.Fatalf("BatchOverhead = %d, an empty v2 batch is %d bytes", BatchOverhead, batchHeader)
	}
	// franz-go counts the batch plus the 4-byte length prefix the produce
	// request puts before it against ProducerBatchMaxBytes.
	const produceRecordsPrefix = 4
	const kafkaDefault, franzDefault = 1048588, 1000012

	l := DeriveLimits(0, kafkaDefault, franzDefault)
	if want := int64(franzDefault) - batchHeader - produceRecordsPrefix; l.Threshold != want {
		t.Errorf("defaults: threshold %d, want %d (the client's cap binds)", l.Threshold, want)
	}
	if l.MaxMessageBytes != kafkaDefault || l.ClientBatchMaxBytes != franzDefault {
		t.Errorf("defaults: limits %+v do not carry the inputs", l)
	}
	if l := DeriveLimits(0, kafkaDefault, 0); l.Threshold != kafkaDefault-batchHeader {
		t.Errorf("no client cap: threshold %d, want %d", l.Threshold, kafkaDefault-batchHeader)
	}
	if l := DeriveLimits(0, 0, 0); l.Threshold != kafkaDefault-batchHeader || l.MaxMessageBytes != kafkaDefault {
		t.Errorf("unknown max.message.bytes: %+v, want Kafka's default", l)
	}
	if l := DeriveLimits(0, 10<<20, 20<<20); l.Threshold != 10<<20-batchHeader {
		t.Errorf("broker binds: threshold %d", l.Threshold)
	}
	// An explicit threshold below the hard limit wins…
	if l := DeriveLimits(500000, kafkaDefault, franzDefault); l.Threshold != 500000 {
		t.Errorf("explicit 500000: threshold %d", l.Threshold)
	}
	// …one above it is capped, so nothing inline can be MESSAGE_TOO_LARGE.
	hard := int64(franzDefault) - batchHeader - produceRecordsPrefix
	for _, explicit := range []int64{hard + 1, 5 << 20, 1 << 40} {
		if l := DeriveLimits(explicit, kafkaDefault, franzDefault); l.Threshold != hard {
			t.Errorf("explicit %d: threshold %d, want the cap %d", explicit, l.Threshold, hard)
		}
	}
	if l := DeriveLimits(hard, kafkaDefault, franzDefault); l.Threshold != hard {
		t.Errorf("explicit = cap: threshold %d", l.Threshold)
	}
}

func TestParseCodec(t *testing.T) {
	cases := []struct {
		props map[string]string
		want  Codec
		err   bool
	}{
		{map[string]string{"compression.type": " ZSTD "}, Codec{Type: "zstd"}, false},
		{map[string]string{"compression.type": "gzip", "compression.gzip.level": "9"}, Codec{Type: "gzip", Level: 9}, false},
		{map[string]string{"compression.type": "gzip", "compression.zstd.level": "3"}, Codec{Type: "gzip"}, false},
		{map[string]string{"compression.type": "snappy", "compression.snappy.level": "3"}, Codec{Type: "snappy"}, false},
		{map[string]string{"compression.type": "lz4", "compression.lz4.level": "x"}, Codec{}, true},
		{map[string]string{"compression.type": "brotli"}, Codec{}, true},
		// Kafka's level numbers map to the Go libraries' levels.
		{map[string]string{"compression.type": "gzip", "compression.gzip.level": "-1"}, Codec{Type: "gzip"}, false},
		{map[string]string{"compression.type": "gzip", "compression.gzip.level": "99"}, Codec{}, true},
		{map[string]string{"compression.type": "zstd", "compression.zstd.level": "3"}, Codec{Type: "zstd", Level: int(zstd.SpeedDefault)}, false},
		{map[string]string{"compression.type": "zstd", "compression.zstd.level": "1"}, Codec{Type: "zstd", Level: int(zstd.SpeedFastest)}, false},
		{map[string]string{"compression.type": "zstd", "compression.zstd.level": "19"}, Codec{Type: "zstd", Level: int(zstd.SpeedBestCompression)}, false},
		{map[string]string{"compression.type": "zstd", "compression.zstd.level": "23"}, Codec{}, true},
		{map[string]string{"compression.type": "lz4", "compression.lz4.level": "1"}, Codec{Type: "lz4", Level: int(lz4.Level1)}, false},
		{map[string]string{"compression.type": "lz4", "compression.lz4.level": "9"}, Codec{Type: "lz4", Level: int(lz4.Level9)}, false},
		{map[string]string{"compression.type": "lz4", "compression.lz4.level": "17"}, Codec{Type: "lz4", Level: int(lz4.Level9)}, false},
		{map[string]string{"compression.type": "lz4", "compression.lz4.level": "0"}, Codec{}, true},
	}
	src := bytes.Repeat([]byte("level check 0123456789 abcdefghij "), 3000)
	for _, c := range cases {
		got, err := ParseCodec(c.props)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("ParseCodec(%v) = %+v, %v; want %+v, err %v", c.props, got, err, c.want, c.err)
		}
		if err != nil {
			continue
		}
		// Whatever the level, Ferry's measure is franz-go's output.
		comp, cerr := kgo.DefaultCompressor(got.KgoCodec())
		if cerr != nil {
			t.Fatal(cerr)
		}
		n, _ := got.CompressedLen(src, 0)
		if out, _ := comp.Compress(new(bytes.Buffer), src); int64(len(out)) != n {
			t.Errorf("%+v: measured %d bytes, franz-go sends %d", got, n, len(out))
		}
	}
}
