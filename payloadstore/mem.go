package payloadstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ferrykit/ferry/internal/ctxio"
)

// MemStoreClass is the payloadStoreClass of references written by MemStore.
const MemStoreClass = "ferry.payloadstore.MemStore"

func init() { Register("mem", openMem) }

// MemStore keeps payloads in process memory: "mem://NAME". Stores opened
// with the same NAME in one process share their objects, so a producer and a
// consumer in one test see each other's payloads. Nothing survives the process.
type MemStore struct {
	root Root
	gen  IDGenerator
	b    *memBucket
}

type memBucket struct {
	mu      sync.RWMutex
	objects map[string]memObject
}

var (
	memMu      sync.Mutex
	memBuckets = map[string]*memBucket{}
)

func openMem(_ context.Context, u *url.URL, opts Options) (PayloadStore, error) {
	if u.Host == "" {
		return nil, &Error{Op: "open", Path: u.Redacted(), Err: fmt.Errorf("mem store URL must name a bucket: mem://NAME")}
	}
	return NewMemStore(u.Host, opts.IDGenerator), nil
}

// NewMemStore returns the in-memory store called name; gen nil means IDUUID.
func NewMemStore(name string, gen IDGenerator) *MemStore {
	memMu.Lock()
	b := memBuckets[name]
	if b == nil {
		b = &memBucket{objects: map[string]memObject{}}
		memBuckets[name] = b
	}
	memMu.Unlock()
	if gen == nil {
		gen = IDUUID{}
	}
	return &MemStore{root: Root("mem://" + name), gen: gen, b: b}
}

func (s *MemStore) Class() string       { return MemStoreClass }
func (s *MemStore) ID(p Payload) string { return s.gen.ID(p) }
func (s *MemStore) Close() error        { return nil }

// Root returns the URL prefix of every full path of this store.
func (s *MemStore) Root() Root { return s.root }

func (s *MemStore) Publish(ctx context.Context, topic string, p Payload) (PayloadResponse, error) {
	key, err := objectKey(topic, objectID(s.gen, p))
	if err != nil {
		return PayloadResponse{}, err
	}
	if _, err := p.Body.Seek(0, io.SeekStart); err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Err: err}
	}
	var buf bytes.Buffer
	buf.Grow(int(p.Size))
	body := newDigestReader(io.LimitReader(p.Body, p.Size+1))
	if _, err := io.Copy(&buf, ctxio.Reader(ctx, body)); err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Retryable: true, Err: err}
	}
	if err := body.check(p); err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Err: err}
	}
	s.b.mu.Lock()
	s.b.objects[key] = memObject{data: buf.Bytes(), mod: time.Now()}
	s.b.mu.Unlock()
	return PayloadResponse{FullPayloadPath: s.root.Path(key)}, nil
}

func (s *MemStore) Download(_ context.Context, fullPath string) (io.ReadCloser, error) {
	key, err := s.root.Key(fullPath)
	if err != nil {
		return nil, err
	}
	s.b.mu.RLock()
	o, ok := s.b.objects[key]
	s.b.mu.RUnlock()
	if !ok {
		return nil, &Error{Op: "download", Path: fullPath, Err: ErrPayloadNotFound}
	}
	return io.NopCloser(bytes.NewReader(o.data)), nil
}

func (s *MemStore) Delete(_ context.Context, fullPath string) error {
	key, err := s.root.Key(fullPath)
	if err != nil {
		err.(*Error).Op = "delete"
		return err
	}
	s.b.mu.Lock()
	delete(s.b.objects, key)
	s.b.mu.Unlock()
	return nil
}

type memObject struct {
	data []byte
	mod  time.Time
}

// List implements Lister.
func (s *MemStore) List(ctx context.Context, topic string, fn func(ObjectInfo) error) error {
	prefix, err := TopicPrefix(topic)
	if err != nil {
		return err
	}
	s.b.mu.RLock()
	var found []ObjectInfo
	for key, o := range s.b.objects {
		if strings.HasPrefix(key, prefix) {
			found = append(found, ObjectInfo{FullPath: s.root.Path(key), Size: int64(len(o.data)), ModTime: o.mod})
		}
	}
	s.b.mu.RUnlock()
	for _, o := range found {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}
