package payloadstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
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

func (s *MemStore) onePass(p Payload) bool { return p.ID != "" || randomIDs(s.gen) }

func (s *MemStore) Publish(ctx context.Context, topic string, p Payload) (PayloadResponse, error) {
	if !s.onePass(p) {
		var err error
		if p, err = hashFirst(ctx, p); err != nil {
			return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(topic), Retryable: !errors.Is(err, ErrPayloadChanged), Err: err}
		}
	}
	key, err := objectKey(topic, objectID(s.gen, p))
	if err != nil {
		return PayloadResponse{}, err
	}
	if _, err := p.Body.Seek(0, io.SeekStart); err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Err: err}
	}
	var buf bytes.Buffer
	buf.Grow(int(p.Size))
	body := newBodyReader(p)
	if _, err := io.Copy(&buf, ctxio.Reader(ctx, body)); err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Retryable: true, Err: err}
	}
	sum, err := body.check(p)
	if err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Err: err}
	}
	s.b.mu.Lock()
	s.b.objects[key] = memObject{data: buf.Bytes(), mod: time.Now(), version: memVersion.Add(1)}
	s.b.mu.Unlock()
	return PayloadResponse{FullPayloadPath: s.root.Path(key), SHA256: sum}, nil
}

func (s *MemStore) Download(_ context.Context, fullPath string) (io.ReadCloser, error) {
	key, err := s.root.keyFor("download", fullPath)
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
	key, err := s.root.keyFor("delete", fullPath)
	if err != nil {
		return err
	}
	s.b.mu.Lock()
	delete(s.b.objects, key)
	s.b.mu.Unlock()
	return nil
}

type memObject struct {
	data    []byte
	mod     time.Time
	version int64
}

// List implements Lister (ferry gc's own keys are left out).
func (s *MemStore) List(ctx context.Context, topic string, fn func(ObjectInfo) error) error {
	prefix, err := TopicPrefix(topic)
	if err != nil {
		return err
	}
	return s.list(ctx, prefix, false, func(_ string, o ObjectInfo) error { return fn(o) })
}

func (s *MemStore) list(ctx context.Context, prefix string, all bool, fn func(string, ObjectInfo) error) error {
	type found struct {
		key string
		o   ObjectInfo
	}
	var fs []found
	s.b.mu.RLock()
	for key, o := range s.b.objects {
		if strings.HasPrefix(key, prefix) && (all || !isGCKey(key)) {
			fs = append(fs, found{key, s.info(key, o)})
		}
	}
	s.b.mu.RUnlock()
	for _, f := range fs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(f.key, f.o); err != nil {
			return err
		}
	}
	return nil
}

func (s *MemStore) info(key string, o memObject) ObjectInfo {
	return ObjectInfo{FullPath: s.root.Path(key), Size: int64(len(o.data)), ModTime: o.mod, Version: fmt.Sprint(o.version)}
}

// memVersion numbers every write, copy and touch of a MemStore object.
var memVersion atomic.Int64

// Stat implements ObjectStore.
func (s *MemStore) Stat(_ context.Context, key string) (ObjectInfo, error) {
	if err := checkRawKey(key); err != nil {
		return ObjectInfo{}, &Error{Op: "stat", Path: s.root.Path(key), Err: err}
	}
	s.b.mu.RLock()
	o, ok := s.b.objects[key]
	s.b.mu.RUnlock()
	if !ok {
		return ObjectInfo{}, &Error{Op: "stat", Path: s.root.Path(key), Err: ErrPayloadNotFound}
	}
	return s.info(key, o), nil
}

// edit applies f to the objects under the lock, after checking the keys.
func (s *MemStore) edit(op string, f func(objs map[string]memObject) error, keys ...string) error {
	for _, k := range keys {
		if err := checkRawKey(k); err != nil {
			return &Error{Op: op, Path: s.root.Path(k), Err: err}
		}
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return f(s.b.objects)
}

func (s *MemStore) missing(op, key string) error {
	return &Error{Op: op, Path: s.root.Path(key), Err: ErrPayloadNotFound}
}

// Copy implements ObjectStore.
func (s *MemStore) Copy(_ context.Context, src, dst string) error {
	return s.edit("copy", func(objs map[string]memObject) error {
		o, ok := objs[src]
		if !ok {
			return s.missing("copy", src)
		}
		objs[dst] = memObject{data: o.data, mod: time.Now(), version: memVersion.Add(1)}
		return nil
	}, src, dst)
}

// Touch implements ObjectStore.
func (s *MemStore) Touch(_ context.Context, key string) error {
	return s.edit("touch", func(objs map[string]memObject) error {
		o, ok := objs[key]
		if !ok {
			return s.missing("touch", key)
		}
		o.mod, o.version = time.Now(), memVersion.Add(1)
		objs[key] = o
		return nil
	}, key)
}

// Move implements ObjectStore (atomic).
func (s *MemStore) Move(_ context.Context, src, dst string) error {
	return s.edit("move", func(objs map[string]memObject) error {
		o, ok := objs[src]
		if !ok {
			return s.missing("move", src)
		}
		objs[dst] = o
		delete(objs, src)
		return nil
	}, src, dst)
}

// Remove implements ObjectStore.
func (s *MemStore) Remove(_ context.Context, key string) error {
	return s.edit("delete", func(objs map[string]memObject) error {
		delete(objs, key)
		return nil
	}, key)
}

// ListKeys implements ObjectStore.
func (s *MemStore) ListKeys(ctx context.Context, prefix string, fn func(string, ObjectInfo) error) error {
	return s.list(ctx, prefix, true, fn)
}

// Put implements ObjectStore.
func (s *MemStore) Put(_ context.Context, key string, b []byte) error {
	return s.edit("put", func(objs map[string]memObject) error {
		objs[key] = memObject{data: bytes.Clone(b), mod: time.Now(), version: memVersion.Add(1)}
		return nil
	}, key)
}

// Get implements ObjectStore.
func (s *MemStore) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	var out []byte
	err := s.edit("get", func(objs map[string]memObject) error {
		o, ok := objs[key]
		if !ok {
			return s.missing("get", key)
		}
		if int64(len(o.data)) > max {
			return &Error{Op: "get", Path: s.root.Path(key), Err: fmt.Errorf("%w: %d bytes > %d", ErrObjectTooLarge, len(o.data), max)}
		}
		out = bytes.Clone(o.data)
		return nil
	}, key)
	return out, err
}

// openKey reads the object at key as it is (Confirm's check of a
// quarantined copy).
func (s *MemStore) openKey(_ context.Context, key string) (io.ReadCloser, error) {
	s.b.mu.RLock()
	o, ok := s.b.objects[key]
	s.b.mu.RUnlock()
	if !ok {
		return nil, s.missing("read", key)
	}
	return io.NopCloser(bytes.NewReader(o.data)), nil
}
