package observe

import (
	"context"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/ferrykit/ferry/payloadstore"
	"go.opentelemetry.io/otel/trace"
)

// Store returns s counted in m and traced by t (either may be nil): every
// Publish, Download, Delete and ObjectStore call is counted by topic,
// operation and result, timed, and, when ctx carries a span, traced as a
// child span "ferry.store <op>". A Publish that succeeds counts an
// offloaded payload of its size; a Download read to its end counts a
// resolved payload of the bytes read. Wrap s with its retry policy first
// (payloadstore.Wrap, as largemessage.Config.OpenStore does) and observe
// the result: one operation is then counted once, its retries inside its
// time. payloadstore.Unwrap sees through the wrapper. With m and t nil, s
// is returned as it is.
func Store(s payloadstore.PayloadStore, m *Metrics, t *Tracer) payloadstore.PayloadStore {
	if m == nil && t == nil {
		return s
	}
	return &store{PayloadStore: s, m: m, t: t}
}

type store struct {
	payloadstore.PayloadStore
	m *Metrics
	t *Tracer
}

// UnwrapStore implements payloadstore.Wrapper.
func (s *store) UnwrapStore() payloadstore.PayloadStore { return s.PayloadStore }

func (s *store) objects() (payloadstore.ObjectStore, error) {
	return payloadstore.Objects(s.PayloadStore)
}

// topicOfPath is the topic of the object a full path names ("" when it
// does not name a payload key of the store).
func (s *store) topicOfPath(fullPath string) string {
	if kp, err := payloadstore.ReferenceKey(s.PayloadStore, fullPath); err == nil {
		return kp.Topic
	}
	return ""
}

// topicOfKey is a key's first segment.
func topicOfKey(key string) string {
	if i := strings.IndexByte(key, '/'); i > 0 {
		return key[:i]
	}
	return ""
}

// begin starts an operation's span and clock.
func (s *store) begin(ctx context.Context, op opIndex, topic string, size int64) (context.Context, trace.Span, time.Time) {
	ctx, span := s.t.startStore(ctx, storeOps[op], topic, s.Class(), size)
	return ctx, span, time.Now()
}

// end counts an operation and ends its span.
func (s *store) end(span trace.Span, op opIndex, topic string, start time.Time, err error) {
	s.m.storeOp(topic, op, time.Since(start), err)
	End(span, err)
}

func (s *store) Publish(ctx context.Context, topic string, p payloadstore.Payload) (payloadstore.PayloadResponse, error) {
	ctx, span, start := s.begin(ctx, ixPublish, topic, p.Size)
	resp, err := s.PayloadStore.Publish(ctx, topic, p)
	if err == nil {
		s.m.Offloaded(topic, p.Size)
		if span.IsRecording() {
			span.SetAttributes(AttrPayloadPath.String(labelValue(resp.FullPayloadPath)))
		}
	}
	s.end(span, ixPublish, topic, start, err)
	return resp, err
}

func (s *store) Download(ctx context.Context, fullPath string) (io.ReadCloser, error) {
	topic := s.topicOfPath(fullPath)
	ctx, span, start := s.begin(ctx, ixDownload, topic, -1)
	if span.IsRecording() {
		span.SetAttributes(AttrPayloadPath.String(labelValue(fullPath)))
	}
	rc, err := s.PayloadStore.Download(ctx, fullPath)
	s.m.storeOp(topic, ixDownload, time.Since(start), err)
	if err != nil {
		End(span, err)
		return nil, err
	}
	return &countingReader{rc: rc, s: s, topic: topic, span: span}, nil
}

// countingReader counts the bytes of a download and, at EOF, a resolved
// payload; the download's span ends at Close.
type countingReader struct {
	rc    io.ReadCloser
	s     *store
	topic string
	span  trace.Span
	n     int64
	eof   bool
	once  sync.Once
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	c.n += int64(n)
	if err == io.EOF && !c.eof {
		c.eof = true
		c.s.m.Resolved(c.topic, c.n)
	}
	return n, err
}

// Close closes the download and ends its span.
func (c *countingReader) Close() error {
	err := c.rc.Close()
	c.once.Do(func() {
		if c.span.IsRecording() {
			c.span.SetAttributes(AttrPayloadSize.Int64(c.n))
		}
		End(c.span, nil)
	})
	return err
}

func (s *store) Delete(ctx context.Context, fullPath string) error {
	topic := s.topicOfPath(fullPath)
	ctx, span, start := s.begin(ctx, ixDelete, topic, -1)
	err := s.PayloadStore.Delete(ctx, fullPath)
	s.end(span, ixDelete, topic, start, err)
	return err
}

// do runs one ObjectStore call on key's topic, counted and traced.
func (s *store) do(ctx context.Context, op opIndex, key string, fn func(ctx context.Context, o payloadstore.ObjectStore) error) error {
	o, err := s.objects()
	if err != nil {
		return err
	}
	topic := topicOfKey(key)
	ctx, span, start := s.begin(ctx, op, topic, -1)
	err = fn(ctx, o)
	s.end(span, op, topic, start, err)
	return err
}

// Root implements payloadstore.ObjectStore ("" when the store has none).
func (s *store) Root() payloadstore.Root {
	if o, err := s.objects(); err == nil {
		return o.Root()
	}
	return ""
}

func (s *store) Stat(ctx context.Context, key string) (payloadstore.ObjectInfo, error) {
	var oi payloadstore.ObjectInfo
	err := s.do(ctx, ixStat, key, func(ctx context.Context, o payloadstore.ObjectStore) (err error) {
		oi, err = o.Stat(ctx, key)
		return err
	})
	return oi, err
}

func (s *store) Copy(ctx context.Context, src, dst string) error {
	return s.do(ctx, ixCopy, dst, func(ctx context.Context, o payloadstore.ObjectStore) error { return o.Copy(ctx, src, dst) })
}

func (s *store) Touch(ctx context.Context, key string) error {
	return s.do(ctx, ixTouch, key, func(ctx context.Context, o payloadstore.ObjectStore) error { return o.Touch(ctx, key) })
}

func (s *store) Move(ctx context.Context, src, dst string) error {
	return s.do(ctx, ixMove, src, func(ctx context.Context, o payloadstore.ObjectStore) error { return o.Move(ctx, src, dst) })
}

func (s *store) Remove(ctx context.Context, key string) error {
	return s.do(ctx, ixRemove, key, func(ctx context.Context, o payloadstore.ObjectStore) error { return o.Remove(ctx, key) })
}

func (s *store) ListKeys(ctx context.Context, prefix string, fn func(string, payloadstore.ObjectInfo) error) error {
	return s.do(ctx, ixList, prefix, func(ctx context.Context, o payloadstore.ObjectStore) error { return o.ListKeys(ctx, prefix, fn) })
}

func (s *store) Put(ctx context.Context, key string, b []byte) error {
	return s.do(ctx, ixPut, key, func(ctx context.Context, o payloadstore.ObjectStore) error { return o.Put(ctx, key, b) })
}

func (s *store) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	var b []byte
	err := s.do(ctx, ixGet, key, func(ctx context.Context, o payloadstore.ObjectStore) (err error) {
		b, err = o.Get(ctx, key, max)
		return err
	})
	return b, err
}

var (
	_ payloadstore.ObjectStore = (*store)(nil)
	_ payloadstore.Wrapper     = (*store)(nil)
)
