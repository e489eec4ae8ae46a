package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferrykit/ferry/internal/ctxio"
	"github.com/ferrykit/ferry/largemessage"
	"github.com/ferrykit/ferry/payloadstore"
)

// maxInMemory caps how much of an input is held in memory to let the exact
// sizing decide (it matters only with compression, where a record larger
// than the threshold may still fit once compressed).
const maxInMemory = 64 << 20

// sender produces one input (a file, bytes, stdin) as one record. Inputs
// that cannot fit inline whatever their compression go the streaming way:
// hashed from disk, published to the store by the serializer
// (Serializer.OffloadValue), and only the reference is produced. The rest
// is read into memory and produced with Producer.ProduceSync, which decides
// exactly whether to offload.
type sender struct {
	prod     *largemessage.Producer
	store    payloadstore.PayloadStore
	hasStore bool
	codec    largemessage.Codec
	progress bool // draw progress bars on stderr
	stderr   io.Writer
}

// sent describes one produced record.
type sent struct {
	Name       string
	Topic      string
	Partition  int32
	Offset     int64
	Size       int64 // bytes of the input (the record's value as produced)
	SHA256     [sha256.Size]byte
	Offloaded  bool
	Path       string // full payload path when offloaded
	KafkaBytes int64  // key + value + headers as stored in Kafka
}

func (s sent) line() string {
	if s.Offloaded {
		return fmt.Sprintf("%s/%d@%d %d bytes offloaded %s", s.Topic, s.Partition, s.Offset, s.Size, s.Path)
	}
	return fmt.Sprintf("%s/%d@%d %d bytes inline", s.Topic, s.Partition, s.Offset, s.Size)
}

// cutoff is the input size above which a record is offloaded whatever the
// codec does: the threshold without compression; with compression, the
// client's uncompressed batch cap (bounded by maxInMemory), since a larger
// input may still compress under the threshold.
func (s *sender) cutoff(ctx context.Context, topic string) (largemessage.Limits, int64) {
	l := s.prod.Limits(ctx, topic)
	c := l.Threshold
	if s.codec.Type != "none" && s.codec.Type != "" && l.ClientBatchMaxBytes > c {
		c = min(l.ClientBatchMaxBytes, maxInMemory)
	}
	return l, c
}

// sendBytes produces value through Producer.ProduceSync.
func (s *sender) sendBytes(ctx context.Context, topic, name string, key, value []byte) (sent, error) {
	out := sent{Name: name, Size: int64(len(value)), SHA256: sha256.Sum256(value)}
	rec := &kgo.Record{Topic: topic, Key: key, Value: value}
	r, err := s.prod.ProduceSync(ctx, rec).First()
	if err != nil {
		if path := referencePath(rec); path != "" {
			s.discard(ctx, path)
		}
		if errors.Is(err, errNoStore) {
			l := s.prod.Limits(ctx, topic)
			return out, fmt.Errorf("%s: the record (%d bytes) is over the threshold of topic %s (%d bytes) and must be offloaded, but %w",
				name, largemessage.RecordLen(key, value, nil), topic, l.Threshold, errNoStore)
		}
		return out, fmt.Errorf("%s: %w", name, err)
	}
	return s.result(out, r), nil
}

func (s *sender) result(out sent, r *kgo.Record) sent {
	out.Topic, out.Partition, out.Offset = r.Topic, r.Partition, r.Offset
	out.Offloaded = largemessage.IsOffloaded(r)
	out.Path = referencePath(r)
	out.KafkaBytes = recordBytes(r)
	return out
}

// sendFile produces the file at path as one record.
func (s *sender) sendFile(ctx context.Context, topic, name string, key []byte, path string) (sent, error) {
	f, err := os.Open(path)
	if err != nil {
		return sent{Name: name}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return sent{Name: name}, err
	}
	if !st.Mode().IsRegular() {
		return sent{Name: name}, fmt.Errorf("%s: not a regular file", path)
	}
	return s.sendOpen(ctx, topic, name, key, f, st.Size())
}

// sendOpen produces the open file f of size bytes.
func (s *sender) sendOpen(ctx context.Context, topic, name string, key []byte, f *os.File, size int64) (sent, error) {
	l, cut := s.cutoff(ctx, topic)
	if size <= cut {
		b := make([]byte, size)
		if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && size == 0) {
			return sent{Name: name}, fmt.Errorf("%s: %w", name, err)
		}
		return s.sendBytes(ctx, topic, name, key, b)
	}
	if !s.hasStore {
		return sent{Name: name}, s.needStore(name, size, topic, l)
	}
	return s.stream(ctx, topic, name, key, f, size)
}

func (s *sender) needStore(name string, size int64, topic string, l largemessage.Limits) error {
	return fmt.Errorf("%s (%d bytes) is larger than topic %s accepts inline (threshold %d bytes) and must be offloaded, but %w",
		name, size, topic, l.Threshold, errNoStore)
}

// stream offloads f without reading it into memory, then produces the
// reference.
func (s *sender) stream(ctx context.Context, topic, name string, key []byte, f *os.File, size int64) (sent, error) {
	out := sent{Name: name}
	var p payloadstore.Payload
	var err error
	if s.progress {
		p, err = hashWithProgress(ctx, f, size, s.bar(size, "hashing   "+name))
	} else {
		p, err = payloadstore.FilePayload(f)
	}
	if err != nil {
		return out, fmt.Errorf("%s: reading: %w", name, err)
	}
	if p.Size != size {
		return out, fmt.Errorf("%s: changed while it was read (%d bytes, then %d)", name, size, p.Size)
	}
	out.Size, out.SHA256 = p.Size, p.SHA256
	if s.progress {
		body := &progressBody{rs: f, bar: s.bar(size, "uploading "+name)}
		defer body.bar.finish()
		p.Body = body
	}
	rec := &kgo.Record{Topic: topic, Key: key}
	// A file changed since it was hashed fails here with
	// payloadstore.ErrPayloadChanged, its object deleted.
	if _, err = s.prod.Serializer().OffloadValue(ctx, rec, p); err != nil {
		return out, fmt.Errorf("%s: %w", name, err)
	}
	path := referencePath(rec)
	r, err := s.prod.Client().ProduceSync(ctx, rec).First()
	if err != nil {
		s.discard(ctx, path)
		return out, fmt.Errorf("%s: producing the reference: %w", name, err)
	}
	return s.result(out, r), nil
}

// discard deletes an object whose reference was never produced.
// An object named by content id may be referenced by earlier records (equal
// keys, or equal values with the sha256 id generator): it stays.
func (s *sender) discard(ctx context.Context, path string) {
	if payloadstore.IsContentID(path) {
		return
	}
	if err := s.store.Delete(context.WithoutCancel(ctx), path); err != nil {
		slog.Warn("could not delete an unreferenced payload", "path", path, "err", err)
	}
}

// sendStdin reads r up to the cutoff into memory; a larger input is spooled
// to a temporary file and streamed from there.
func (s *sender) sendStdin(ctx context.Context, topic, name string, key []byte, r io.Reader) (sent, error) {
	l, cut := s.cutoff(ctx, topic)
	head, err := io.ReadAll(io.LimitReader(r, cut+1))
	if err != nil {
		return sent{Name: name}, fmt.Errorf("reading standard input: %w", err)
	}
	if int64(len(head)) <= cut {
		return s.sendBytes(ctx, topic, name, key, head)
	}
	if !s.hasStore {
		return sent{Name: name}, fmt.Errorf("standard input (more than %d bytes) is larger than topic %s accepts inline (threshold %d bytes) and must be offloaded, but %w",
			cut, topic, l.Threshold, errNoStore)
	}
	tmp, err := os.CreateTemp("", "ferry-stdin-*")
	if err != nil {
		return sent{Name: name}, fmt.Errorf("spooling standard input: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	var bar *progress
	if s.progress {
		bar = s.bar(-1, "reading   stdin")
	}
	n, err := io.Copy(io.MultiWriter(tmp, bar), io.MultiReader(bytes.NewReader(head), ctxio.Reader(ctx, r)))
	bar.finish()
	if err != nil {
		return sent{Name: name}, fmt.Errorf("spooling standard input to %s: %w", tmp.Name(), err)
	}
	slog.Debug("standard input spooled", "file", tmp.Name(), "bytes", n)
	return s.stream(ctx, topic, name, key, tmp, n)
}

// hashWithProgress is payloadstore.FilePayload with a progress bar and
// cancellation.
func hashWithProgress(ctx context.Context, f *os.File, size int64, bar *progress) (payloadstore.Payload, error) {
	defer bar.finish()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return payloadstore.Payload{}, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, bar), ctxio.Reader(ctx, f))
	if err != nil {
		return payloadstore.Payload{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return payloadstore.Payload{}, err
	}
	p := payloadstore.Payload{Body: f, Size: n}
	copy(p.SHA256[:], h.Sum(nil))
	return p, nil
}

// progressBody advances a progress bar as the store reads a payload body; a
// seek back to the start (a retry) starts the bar over. (That the bytes read
// match the payload's SHA-256 is the store policy's check:
// payloadstore.ErrPayloadChanged.)
type progressBody struct {
	rs  io.ReadSeeker
	bar *progress
}

func (b *progressBody) Read(p []byte) (int, error) {
	n, err := b.rs.Read(p)
	b.bar.add(n)
	return n, err
}

func (b *progressBody) Seek(offset int64, whence int) (int64, error) {
	pos, err := b.rs.Seek(offset, whence)
	if err == nil && pos == 0 {
		b.bar.set(0)
	}
	return pos, err
}
