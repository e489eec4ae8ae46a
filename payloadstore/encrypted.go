package payloadstore

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/ferrykit/ferry/envelope"
)

// Encryption configures Encrypted.
type Encryption struct {
	// Keyring seals new payloads (under its KeyURL) and opens sealed ones
	// (under any of its keys). Encrypted's store closes it.
	Keyring *envelope.Keyring
	// AllowPlaintext lets Download return objects that are not sealed
	// (large.message.payload.encryption.allow.plaintext): payloads written
	// before encryption was turned on. Off by default, so that an object
	// swapped for a plaintext one by someone with access to the bucket is
	// refused rather than returned.
	AllowPlaintext bool
	// IDGenerator is the store's (Options.IDGenerator): with a content id
	// (sha256) the plaintext is hashed before it is sealed, as the id
	// names the object.
	IDGenerator IDGenerator
}

// IsEncrypted reports whether s (through Wrap and observing wrappers) seals
// its payloads (Encrypted). ObjectInfo sizes of such a store are those of the
// sealed objects.
func IsEncrypted(s PayloadStore) bool {
	_, ok := Unwrap(s).(*encryptedStore)
	return ok
}

// Underlying returns the store that holds the bytes under s: Unwrap's
// result, and under an Encrypted store the store it seals into. Its
// ObjectStore operations (Move, Stat, …) are those s performs.
func Underlying(s PayloadStore) PayloadStore {
	s = Unwrap(s)
	if e, ok := s.(*encryptedStore); ok {
		return Unwrap(e.PayloadStore)
	}
	return s
}

// ErrPlaintextRefused: Download found an object that is not sealed, and
// AllowPlaintext is off.
var ErrPlaintextRefused = errors.New("the object is not encrypted (large.message.payload.encryption.allow.plaintext is false)")

// Encrypted returns s (a store of this package, not yet Wrapped) with every
// payload sealed by enc.Keyring (package envelope, docs/FORMAT.md §9): each
// Publish streams the payload through Tink's AES256-GCM-HKDF streaming AEAD
// under a data key the KMS wrapped, bound to the topic and object key; each
// Download checks and opens it, segment by segment, in bounded memory.
// Sizes and digests stay the plaintext's: Payload.Size and SHA256 and
// PayloadResponse.SHA256 describe the plaintext, so references and their
// headers are the same as without encryption. ObjectStore operations act
// on the sealed objects, except Copy, which opens the source and seals it
// again for its new key (an object is bound to its key, so a byte copy
// would not open there).
//
// Errors: Publish wraps envelope.ErrKMS (retryable when the KMS may
// recover) or envelope.ErrDecryptOnly; Download wraps ErrPlaintextRefused,
// envelope.ErrUnknownKey, ErrKMS or ErrFormat, and its reader fails with
// envelope.ErrAuthentication on bytes that do not authenticate.
func Encrypted(s PayloadStore, enc Encryption) PayloadStore {
	o, _ := Objects(s)
	return &encryptedStore{PayloadStore: s, objs: o, enc: enc}
}

type encryptedStore struct {
	PayloadStore
	objs ObjectStore // nil for a store without key-level operations
	enc  Encryption
}

// onePass: the plaintext is hashed while it is sealed, unless a content id
// needs its digest first, or the store under it reads its body twice (the
// cloud stores hash it first: the plaintext is then sealed twice, with the
// same bytes each time).
func (e *encryptedStore) onePass(p Payload) bool {
	inner, ok := e.PayloadStore.(hashingStore)
	return ok && inner.onePass(Payload{ID: "sealed", Unhashed: true, ReadOnce: p.ReadOnce}) && (p.ID != "" || randomIDs(e.enc.IDGenerator))
}

func (e *encryptedStore) Close() error {
	return errors.Join(e.PayloadStore.Close(), e.enc.Keyring.Close())
}

func (e *encryptedStore) Publish(ctx context.Context, topic string, p Payload) (PayloadResponse, error) {
	if p.Unhashed && !e.onePass(p) {
		var err error
		if p, err = hashFirst(ctx, p); err != nil {
			return PayloadResponse{}, &Error{Op: "publish", Path: topic, Retryable: !errors.Is(err, ErrPayloadChanged), Err: err}
		}
	}
	if p.ID == "" {
		p.ID = e.PayloadStore.ID(p)
	}
	key, err := objectKey(topic, p.ID)
	if err != nil {
		return PayloadResponse{}, err
	}
	size := p.Size
	body := p.Body
	return e.seal(ctx, topic, key, p.ID, size, func() (io.Reader, error) {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		return body, nil
	}, p)
}

// seal publishes, at key (topic and id), the sealed form of the size
// plaintext bytes open yields (called again for each pass from offset 0).
// want, when it carries a digest, is checked against the plaintext.
func (e *encryptedStore) seal(ctx context.Context, topic, key, id string, size int64, open func() (io.Reader, error), want Payload) (PayloadResponse, error) {
	sealer, err := e.enc.Keyring.NewStreamSealer(ctx, topic)
	if err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: e.path(key), Retryable: kmsRetryable(err), Err: err}
	}
	body := &sealingBody{ctx: ctx, open: open, size: size, sealer: sealer, aad: envelope.PayloadAAD{Topic: topic, Key: key}}
	if !want.Unhashed && want.SHA256 != ([sha256.Size]byte{}) {
		body.want = &want.SHA256
	}
	defer body.stop()
	resp, err := e.PayloadStore.Publish(ctx, topic, Payload{Body: body, Size: sealer.SealedSize(size), Unhashed: true, ReadOnce: want.ReadOnce, ID: id, uncheckedDigest: true})
	if err != nil {
		// The sealing side's error says more than the store's read
		// error it caused (a plaintext of the wrong size).
		if serr := body.failure(); serr != nil {
			return PayloadResponse{}, &Error{Op: "publish", Path: e.path(key), Err: serr}
		}
		return PayloadResponse{}, err
	}
	sum, n, ok := body.digest()
	if !ok || n != size {
		// (the sealing side checks size and digest before the last
		// segment, so the store never commits such bytes; this is the
		// store having read less than it should)
		err = fmt.Errorf("%w: sealed %d plaintext bytes, want %d", ErrPayloadChanged, n, size)
		var derr error
		if !IsContentID(resp.FullPayloadPath) {
			derr = e.PayloadStore.Delete(context.WithoutCancel(ctx), resp.FullPayloadPath)
		}
		return PayloadResponse{}, &Error{Op: "publish", Path: resp.FullPayloadPath, Err: errors.Join(err, derr)}
	}
	resp.SHA256 = sum
	return resp, nil
}

func (e *encryptedStore) path(key string) string {
	if e.objs != nil {
		return e.objs.Root().Path(key)
	}
	return key
}

func kmsRetryable(err error) bool {
	var ke *envelope.KMSError
	return errors.As(err, &ke) && ke.Retryable
}

func (e *encryptedStore) Download(ctx context.Context, fullPath string) (io.ReadCloser, error) {
	if e.objs == nil {
		return nil, &Error{Op: "download", Path: fullPath, Err: errors.New("an encrypted store needs key-level operations (payloadstore.ObjectStore)")}
	}
	key, err := e.objs.Root().keyFor("download", fullPath)
	if err != nil {
		return nil, err
	}
	rc, err := e.PayloadStore.Download(ctx, fullPath)
	if err != nil {
		return nil, err
	}
	r, err := e.open(ctx, rc, key)
	if err != nil {
		rc.Close()
		var se *Error
		if errors.As(err, &se) {
			return nil, err
		}
		return nil, &Error{Op: "download", Path: fullPath, Retryable: kmsRetryable(err), Err: err}
	}
	return &openedObject{r: r, rc: rc, path: fullPath}, nil
}

// openedObject reads a sealed object's plaintext; a failure to authenticate
// is an *Error that is not retryable (the bytes are wrong, not the store
// unreachable).
type openedObject struct {
	r    io.Reader
	rc   io.ReadCloser
	path string
}

func (o *openedObject) Read(p []byte) (int, error) {
	n, err := o.r.Read(p)
	if err != nil && err != io.EOF {
		var se *Error
		if !errors.As(err, &se) && (errors.Is(err, envelope.ErrAuthentication) || errors.Is(err, envelope.ErrFormat)) {
			err = &Error{Op: "download", Path: o.path, Err: err}
		}
	}
	return n, err
}

func (o *openedObject) Close() error { return o.rc.Close() }

// open returns the plaintext of the object rc reads, at key.
func (e *encryptedStore) open(ctx context.Context, rc io.Reader, key string) (io.Reader, error) {
	kp, err := ParseKey(key)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(rc, 4096)
	head, err := br.Peek(len(envelope.Magic) + 2)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	// A sealed record value (the encrypt interceptor's, offloaded by
	// large-message without payload encryption) is a payload like any
	// other, not a sealed object.
	if !envelope.IsSealed(head) || len(head) > 9 && head[9] == envelope.AlgAES256GCM {
		if e.enc.AllowPlaintext {
			return br, nil
		}
		if envelope.IsSealed(head) {
			return nil, fmt.Errorf("%w: it holds a record value sealed by the proxy's encrypt interceptor, offloaded without payload encryption (read the topic through the proxy)", ErrPlaintextRefused)
		}
		return nil, ErrPlaintextRefused
	}
	return e.enc.Keyring.OpenStream(ctx, br, envelope.PayloadAAD{Topic: kp.Topic, Key: key})
}

// Copy opens the object at src and seals it again at dst: a sealed object
// is bound to its key. A plaintext source (AllowPlaintext) is copied as it
// is.
func (e *encryptedStore) Copy(ctx context.Context, src, dst string) error {
	if e.objs == nil {
		return &Error{Op: "copy", Path: src, Err: errors.New("no key-level operations")}
	}
	oi, err := e.objs.Stat(ctx, src)
	if err != nil {
		return err
	}
	// The fixed header gives the plaintext's size.
	rc, err := e.PayloadStore.Download(ctx, e.objs.Root().Path(src))
	if err != nil {
		return err
	}
	fixed := make([]byte, envelope.FixedHeaderBytes)
	n, rerr := io.ReadFull(rc, fixed)
	rc.Close()
	if !envelope.IsSealed(fixed[:n]) {
		if !e.enc.AllowPlaintext {
			return &Error{Op: "copy", Path: e.path(src), Err: ErrPlaintextRefused}
		}
		return e.objs.Copy(ctx, src, dst)
	}
	if rerr != nil {
		return &Error{Op: "copy", Path: e.path(src), Err: fmt.Errorf("%w: %v", envelope.ErrFormat, rerr)}
	}
	size, err := envelope.PlainSizeOf(fixed, oi.Size)
	if err != nil {
		return &Error{Op: "copy", Path: e.path(src), Err: err}
	}
	kp, err := ParseKey(dst)
	if err != nil {
		return err
	}
	var cur io.Closer
	defer func() {
		if cur != nil {
			cur.Close()
		}
	}()
	open := func() (io.Reader, error) {
		if cur != nil {
			cur.Close()
		}
		rc, err := e.Download(ctx, e.objs.Root().Path(src))
		if err != nil {
			return nil, err
		}
		cur = rc
		return rc, nil
	}
	_, err = e.seal(ctx, kp.Topic, dst, kp.ID, size, open, Payload{Unhashed: true})
	return err
}

// The rest of ObjectStore acts on sealed objects as they are.
func (e *encryptedStore) Root() Root { return e.objs.Root() }
func (e *encryptedStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	return e.objs.Stat(ctx, key)
}
func (e *encryptedStore) Touch(ctx context.Context, key string) error { return e.objs.Touch(ctx, key) }
func (e *encryptedStore) Move(ctx context.Context, src, dst string) error {
	return e.objs.Move(ctx, src, dst)
}
func (e *encryptedStore) Remove(ctx context.Context, key string) error {
	return e.objs.Remove(ctx, key)
}
func (e *encryptedStore) ListKeys(ctx context.Context, prefix string, fn func(string, ObjectInfo) error) error {
	return e.objs.ListKeys(ctx, prefix, fn)
}
func (e *encryptedStore) Put(ctx context.Context, key string, b []byte) error {
	return e.objs.Put(ctx, key, b)
}
func (e *encryptedStore) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	return e.objs.Get(ctx, key, max)
}

// List lists the sealed objects (Lister), for ferry gc.
func (e *encryptedStore) List(ctx context.Context, topic string, fn func(ObjectInfo) error) error {
	return List(ctx, e.PayloadStore, topic, fn)
}

// sealingBody is the Body of a sealed payload: a reader of the sealed bytes
// of the plaintext open yields, sealed by a goroutine as the store reads
// (so that sealing and writing overlap). Seek(0, io.SeekStart) starts
// again from the plaintext's start; the sealer writes the same bytes each
// time. It hashes the plaintext as it seals it.
type sealingBody struct {
	ctx    context.Context
	open   func() (io.Reader, error)
	size   int64
	want   *[sha256.Size]byte // the plaintext's digest, when known
	sealer *envelope.StreamSealer
	aad    envelope.PayloadAAD

	pr   *io.PipeReader
	done chan struct{}

	mu  sync.Mutex
	sum [sha256.Size]byte
	n   int64
	ok  bool
	err error
}

func (b *sealingBody) Read(p []byte) (int, error) {
	if b.pr == nil {
		b.start()
	}
	return b.pr.Read(p)
}

func (b *sealingBody) Seek(off int64, whence int) (int64, error) {
	if off != 0 || whence != io.SeekStart {
		return 0, fmt.Errorf("a sealed payload seeks only to its start (offset %d, whence %d)", off, whence)
	}
	b.stop()
	return 0, nil
}

func (b *sealingBody) start() {
	pr, pw := io.Pipe()
	b.pr, b.done = pr, make(chan struct{})
	b.mu.Lock()
	b.ok, b.err = false, nil
	b.mu.Unlock()
	go func() {
		defer close(b.done)
		err := b.run(pw)
		pw.CloseWithError(err)
	}()
}

func (b *sealingBody) run(pw *io.PipeWriter) error {
	src, err := b.open()
	if err != nil {
		return b.fail(err)
	}
	w, err := b.sealer.NewWriter(pw, b.aad)
	if err != nil {
		return b.fail(err)
	}
	d := newDigestReader(io.LimitReader(src, b.size+1))
	if _, err := io.Copy(w, d); err != nil {
		return b.fail(err)
	}
	if d.n != b.size {
		return b.fail(fmt.Errorf("%w: body gave %d bytes, want %d", ErrPayloadChanged, d.n, b.size))
	}
	// Checked before the last segment is written: the store fails its
	// read and commits nothing (a content-id object that others already
	// reference stays as it is).
	if sum := d.sum(); b.want != nil && sum != *b.want {
		return b.fail(fmt.Errorf("%w: the plaintext's SHA-256 is %x, the payload's %x", ErrPayloadChanged, sum, *b.want))
	}
	if err := w.Close(); err != nil {
		return b.fail(err)
	}
	b.mu.Lock()
	b.sum, b.n, b.ok = d.sum(), d.n, true
	b.mu.Unlock()
	return nil
}

// fail records err, when it is the sealing side's own (not the store
// having stopped reading), for failure.
func (b *sealingBody) fail(err error) error {
	if !errors.Is(err, io.ErrClosedPipe) {
		b.mu.Lock()
		b.err = err
		b.mu.Unlock()
	}
	return err
}

// stop ends the current pass: its goroutine returns once the pipe is closed.
func (b *sealingBody) stop() {
	if b.pr == nil {
		return
	}
	b.pr.CloseWithError(io.ErrClosedPipe)
	<-b.done
	b.pr = nil
}

func (b *sealingBody) failure() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// digest is the plaintext's digest and size from the last complete pass.
func (b *sealingBody) digest() ([sha256.Size]byte, int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sum, b.n, b.ok
}
