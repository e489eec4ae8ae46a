package largemessage

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Byte overheads of Kafka's record batch (magic v2). The broker compares
// BatchOverhead + the (compressed) records with max.message.bytes; franz-go
// compares BatchOverhead + 4 (the produce request's length prefix) + the
// uncompressed records with ProducerBatchMaxBytes.
const (
	BatchOverhead          = 61
	clientBatchOverhead    = BatchOverhead + 4
	DefaultMaxMessageBytes = 1048588 // Kafka's message.max.bytes default
)

// Codec is the producer's compression.type with its level (KIP-390's
// compression.<codec>.level, held as the Go library's level number), measured with the same libraries and settings
// franz-go uses, so that a measured size is the size franz-go sends.
type Codec struct {
	Type  string // "none", "gzip", "snappy", "lz4" or "zstd"; "" = unset (NewProducer takes the client's; elsewhere none)
	Level int    // 0: the codec's default, as in franz-go
}

// ParseCodec reads compression.type and compression.<type>.level from props.
func ParseCodec(props map[string]string) (Codec, error) {
	c := Codec{Type: strings.ToLower(strings.TrimSpace(props["compression.type"]))}
	switch c.Type {
	case "": // unset: NewProducer takes the client's codec
	case "none", "gzip", "snappy", "lz4", "zstd":
	default:
		return c, fmt.Errorf("compression.type: %q is not one of none, gzip, snappy, lz4, zstd", c.Type)
	}
	if v, ok := props["compression."+c.Type+".level"]; ok && c.Type != "none" && c.Type != "snappy" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("compression.%s.level: %q is not an integer", c.Type, v)
		}
		// Kafka's level numbers (KIP-390), turned into the Go libraries'
		// levels so that franz-go compresses as a Java producer set the
		// same way would: gzip 1..9 as is; lz4 1..17 to pierrec Level1..9
		// (above 9, Level9: both are its high-compression mode); zstd
		// -131072..22 to klauspost's four speeds (EncoderLevelFromZstd).
		switch {
		case c.Type == "gzip" && (n >= 1 && n <= 9 || n == -1):
			c.Level = n
			if n == -1 {
				c.Level = 0 // the library's default, 6
			}
		case c.Type == "lz4" && n >= 1 && n <= 17:
			c.Level = int(lz4.Level1) << (min(n, 9) - 1)
		case c.Type == "zstd" && n >= -131072 && n <= 22:
			c.Level = int(zstd.EncoderLevelFromZstd(n))
		default:
			return c, fmt.Errorf("compression.%s.level: %d is out of Kafka's range (gzip 1..9 or -1, lz4 1..17, zstd -131072..22)", c.Type, n)
		}
	}
	return c, nil
}

// KgoCodec is the franz-go codec for c, for kgo.ProducerBatchCompression.
func (c Codec) KgoCodec() kgo.CompressionCodec {
	switch c.Type {
	case "gzip":
		return kgo.GzipCompression().WithLevel(c.Level)
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression().WithLevel(c.Level)
	case "zstd":
		return kgo.ZstdCompression().WithLevel(c.Level)
	}
	return kgo.NoCompression()
}

// Limits are the byte limits a topic's records must fit.
type Limits struct {
	// Threshold is large.message.threshold.bytes as in force: a record whose
	// records section as sent (compressed if that is smaller, as franz-go
	// does) is longer is offloaded. Never above MaxMessageBytes-BatchOverhead.
	Threshold int64
	// MaxMessageBytes is the topic's max.message.bytes read from the
	// cluster (the broker's check, after compression).
	MaxMessageBytes int64
	// ClientBatchMaxBytes is the client's cap on an uncompressed batch
	// (franz-go ProducerBatchMaxBytes, Java max.request.size); 0 for none.
	ClientBatchMaxBytes int64
	// TopicCompression is the topic's compression.type ("producer" or ""
	// when the broker keeps the producer's batch; "uncompressed", "gzip",
	// "snappy", "lz4", "zstd" when it re-encodes batches of another codec).
	TopicCompression string
}

// brokerRecompresses reports whether the broker re-encodes a batch sent
// with codec c for a topic of compression.type t.
func brokerRecompresses(t string, c Codec) bool {
	switch t {
	case "", "producer":
		return false
	case "uncompressed":
		return c.Type != "" && c.Type != "none"
	}
	if c.Type == "" {
		return t != "none"
	}
	return t != c.Type
}

// recompressedBound is an upper bound of the records section after the
// broker re-encodes n uncompressed bytes with codec t. Java's encoders
// differ from Go's, so the exact output cannot be computed here; a bound on
// the worst case (incompressible input) is safe, where a ratio is not.
// Worst cases: deflate stored blocks 5 B per 16 KiB + 18 B, zstd 1/256 + 64
// B, LZ4 frames 4 B per 64 KiB block + 19 B, snappy (xerial) n/6 + 32 B per
// 32 KiB block + 16 B.
func recompressedBound(t string, n int64) int64 {
	switch t {
	case "uncompressed":
		return n
	case "snappy":
		return n + n/6 + 32*(n/32768+1) + 16
	}
	return n + n/128 + 1024
}

// DeriveLimits returns the limits for a topic: the threshold is explicit
// when > 0, else the largest record the broker and client both accept; in
// both cases it is capped so that no inline record can fail with
// MESSAGE_TOO_LARGE.
func DeriveLimits(explicit, maxMessageBytes, clientBatchMaxBytes int64) Limits {
	if maxMessageBytes <= 0 {
		maxMessageBytes = DefaultMaxMessageBytes
	}
	hard := maxMessageBytes - BatchOverhead
	if clientBatchMaxBytes > 0 && clientBatchMaxBytes-clientBatchOverhead < hard {
		hard = clientBatchMaxBytes - clientBatchOverhead
	}
	t := hard
	if explicit > 0 && explicit < hard {
		t = explicit
	}
	return Limits{Threshold: t, MaxMessageBytes: maxMessageBytes, ClientBatchMaxBytes: clientBatchMaxBytes}
}

// RecordLen is the exact size of rec encoded as the only record of a magic
// v2 batch (length varint, attributes, zero timestamp and offset deltas, key,
// value, headers), which is what the batch's records section holds.
func RecordLen(key, value []byte, headers []kgo.RecordHeader) int64 {
	n := recordBodyLen(key, value, headers)
	return int64(kbin.VarintLen(int32(n)) + n)
}

// recordBodyLen is RecordLen without the record's own length varint.
func recordBodyLen(key, value []byte, headers []kgo.RecordHeader) int {
	n := 1 + 1 + 1 // attributes, timestampDelta 0, offsetDelta 0
	n += bytesLen(key) + bytesLen(value)
	n += kbin.VarintLen(int32(len(headers)))
	for _, h := range headers {
		n += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + bytesLen(h.Value)
	}
	return n
}

func bytesLen(b []byte) int {
	if b == nil {
		return 1 // varint -1
	}
	return kbin.VarintLen(int32(len(b))) + len(b)
}

// errOver stops a measurement once it passes the limit.
var errOver = errors.New("over the limit")

// countWriter counts bytes and fails once the count passes limit.
type countWriter struct{ n, limit int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	if w.n > w.limit {
		return 0, errOver
	}
	return len(p), nil
}

// Fits reports whether a record with this key, value and headers can be
// produced inline under l with codec c. The answer is exact: it measures
// the bytes franz-go would send, never an estimated ratio (KIP-126).
//
// Order of work: a record over the client's uncompressed cap never fits; one
// whose uncompressed size is within the threshold always fits (franz-go sends
// the uncompressed form when compression does not shrink it); otherwise it is
// compressed and counted, gzip and lz4 stopping as soon as the count passes
// the threshold (franz-go streams them through an io.Writer); snappy and zstd
// are block encoders in franz-go, so the record (at most the client's cap) is
// encoded whole.
func (c Codec) Fits(l Limits, key, value []byte, headers []kgo.RecordHeader) (bool, error) {
	u := RecordLen(key, value, headers)
	if fits, decided := c.fitsBySize(l, u); decided {
		return fits, nil
	}
	if l.TopicCompression == c.Type {
		// The topic's compression.type is the client's codec: the broker
		// keeps a batch franz-go compressed, but franz-go sends the
		// records uncompressed when compression does not shrink them,
		// and the broker then compresses them itself.
		n, err := c.compressedRecordLen(key, value, headers, u, l.Threshold)
		if err != nil || n < 0 {
			return false, err
		}
		return n < u && n <= l.Threshold, nil
	}
	n, err := c.compressedRecordLen(key, value, headers, u, l.Threshold)
	if err != nil || n < 0 {
		return false, err
	}
	return n <= l.Threshold, nil
}

// FitsLen is Fits for a record known only by its length u (RecordLen),
// such as one whose value has not arrived yet: decided is false when its
// length alone cannot decide (a compressed batch whose records the broker
// keeps as the client compressed them).
func (c Codec) FitsLen(l Limits, u int64) (fits, decided bool) { return c.fitsBySize(l, u) }

// fitsBySize is the part of Fits that needs no compression: whether a
// record of u bytes (RecordLen) fits l, when its length alone decides
// (decided); otherwise the record must be compressed and measured.
func (c Codec) fitsBySize(l Limits, u int64) (fits, decided bool) {
	if l.ClientBatchMaxBytes > 0 {
		// franz-go sizes the first record of a new batch as 65 + its v2
		// length, whatever the produce version (sink.go tryBuffer).
		if clientBatchOverhead+u > l.ClientBatchMaxBytes {
			return false, true
		}
	}
	if brokerRecompresses(l.TopicCompression, c) {
		return recompressedBound(l.TopicCompression, u) <= l.Threshold, true
	}
	if l.TopicCompression == c.Type && c.Type != "none" && c.Type != "" {
		// (see Fits) the broker may compress the records itself
		return true, recompressedBound(l.TopicCompression, u) <= l.Threshold
	}
	if u <= l.Threshold {
		return true, true
	}
	if c.Type == "none" || c.Type == "" {
		return false, true
	}
	return false, false
}

// compressedRecordLen is the length of the record (u bytes uncompressed)
// compressed with c, or -1 once it is known to pass limit.
func (c Codec) compressedRecordLen(key, value []byte, headers []kgo.RecordHeader, u, limit int64) (int64, error) {
	rec := appendRecord(make([]byte, 0, u), key, value, headers)
	n, err := c.CompressedLen(rec, limit)
	if errors.Is(err, errOver) {
		return -1, nil
	}
	return n, err
}

func appendRecord(dst, key, value []byte, headers []kgo.RecordHeader) []byte {
	r := kmsg.Record{Length: int32(recordBodyLen(key, value, headers)), Key: key, Value: value}
	for _, h := range headers {
		r.Headers = append(r.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
	}
	return r.AppendTo(dst)
}

// CompressedLen is the length of src compressed with c exactly as franz-go
// compresses a batch's records. With limit > 0, gzip and lz4 stop and return
// an error wrapping errOver once the output passes limit.
func (c Codec) CompressedLen(src []byte, limit int64) (int64, error) {
	switch c.Type {
	case "gzip", "lz4":
		cw := &countWriter{limit: limit}
		if limit <= 0 {
			cw.limit = 1<<63 - 1
		}
		var w io.WriteCloser
		if c.Type == "gzip" {
			level := gzip.DefaultCompression
			if c.Level != 0 {
				if _, err := gzip.NewWriterLevel(nil, c.Level); err == nil {
					level = c.Level
				}
			}
			w, _ = gzip.NewWriterLevel(cw, level)
		} else {
			lw := lz4.NewWriter(cw)
			if err := lw.Apply(lz4.CompressionLevelOption(lz4.CompressionLevel(max(c.Level, 0)))); err != nil {
				lw = lz4.NewWriter(cw)
			}
			w = lw
		}
		for len(src) > 0 {
			chunk := src[:min(len(src), 64<<10)]
			src = src[len(chunk):]
			if _, err := w.Write(chunk); err != nil {
				return cw.n, err
			}
		}
		if err := w.Close(); err != nil {
			return cw.n, err
		}
		return cw.n, nil
	case "snappy":
		return int64(len(s2.EncodeSnappy(nil, src))), nil
	case "zstd":
		pool := zstdPool(c.Level)
		v := pool.Get()
		enc, ok := v.(*zstd.Encoder)
		if !ok {
			return 0, fmt.Errorf("zstd encoder: %w", v.(error))
		}
		defer pool.Put(enc)
		return int64(len(enc.EncodeAll(src, make([]byte, 0, enc.MaxEncodedSize(len(src)))))), nil
	}
	return int64(len(src)), nil
}

// zstdPools holds, per compression level, a sync.Pool of the encoders
// CompressedLen measures with: an encoder allocates about a megabyte of
// state, too much to make for every record a proxy sizes. EncodeAll
// resets the encoder, so a reused one gives the same output.
var zstdPools sync.Map // int -> *sync.Pool

func zstdPool(level int) *sync.Pool {
	if p, ok := zstdPools.Load(level); ok {
		return p.(*sync.Pool)
	}
	p, _ := zstdPools.LoadOrStore(level, &sync.Pool{New: func() any {
		opts := []zstd.EOption{zstd.WithWindowSize(64 << 10), zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true)}
		// A level zstd does not know is measured at its default, as
		// franz-go's codec falls back to it.
		if probe, err := zstd.NewWriter(nil, append(opts, zstd.WithEncoderLevel(zstd.EncoderLevel(level)))...); err == nil {
			return probe
		}
		enc, err := zstd.NewWriter(nil, opts...)
		if err != nil {
			return err
		}
		return enc
	}})
	return p.(*sync.Pool)
}

// checkAgainstClient compresses a fixed sample with c and with the client's
// own compressor and fails if the sizes differ: Ferry's sizes are exact only
// if it measures with the codec and level the client uses.
func (c Codec) checkAgainstClient(comp kgo.Compressor) error {
	sample := bytes.Repeat([]byte("ferry exact sizing sample 0123456789 "), 4096)
	for i := range sample {
		if i%7 == 0 {
			sample[i] = byte(i * 31)
		}
	}
	want := int64(len(sample))
	if comp != nil {
		out, _ := comp.Compress(new(bytes.Buffer), sample)
		want = int64(len(out))
	}
	got, err := c.CompressedLen(sample, 0)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("the client's compression differs from compression.type=%s (level %d): %d vs %d bytes on a sample; configure the client with largemessage.Codec.KgoCodec()", c.Type, c.Level, want, got)
	}
	return nil
}

// describe names the limit that sets l.Threshold and the setting that
// raises it, for error messages.
func (l Limits) describe() string {
	topic := l.MaxMessageBytes - BatchOverhead
	client := int64(-1)
	if l.ClientBatchMaxBytes > 0 {
		client = l.ClientBatchMaxBytes - clientBatchOverhead
	}
	switch {
	case l.Threshold < topic && (client < 0 || l.Threshold < client):
		return fmt.Sprintf("set by %s", KeyThreshold)
	case client >= 0 && client < topic:
		return fmt.Sprintf("set by the client's batch cap of %d bytes: raise max.request.size (franz-go ProducerBatchMaxBytes)", l.ClientBatchMaxBytes)
	}
	return fmt.Sprintf("set by the topic's max.message.bytes of %d bytes: raise it on the topic", l.MaxMessageBytes)
}

// StoredBatchSize is an upper bound, in bytes, of a record batch as the
// broker stores it and checks it against max.message.bytes: the batch as
// sent (sent bytes, records compressed with batchCodec) when the broker
// keeps it, or, when the topic's compression.type makes the broker
// re-encode it (another codec, or a codec for an uncompressed batch), the
// batch header plus the worst case of that codec over the uncompressed
// records section (uncompressed bytes). batchCodec is "none", "gzip",
// "snappy", "lz4" or "zstd"; topicCompression as Limits.TopicCompression.
func StoredBatchSize(topicCompression, batchCodec string, sent, uncompressed int64) int64 {
	if !brokerRecompresses(topicCompression, Codec{Type: batchCodec}) {
		return sent
	}
	return BatchOverhead + recompressedBound(topicCompression, uncompressed)
}
