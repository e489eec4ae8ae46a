package payloadstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/ferrykit/ferry/internal/ctxio"
)

// FileStoreClass is the payloadStoreClass of references written by FileStore.
const FileStoreClass = "ferry.payloadstore.FileStore"

func init() { Register("file", openFile) }

// objectMode is the permission of a stored object: readable by all, like a
// file created with the usual umask 022. Access control is the directory's.
const objectMode = 0o644

// FileStore keeps payloads as files under a directory: "file:///DIR"
// (absolute) stores <topic>/<id> below DIR. It is the embedded default and
// suits a shared file system (NFS, a mounted volume) as well.
//
// Publish writes to a temporary file in the destination folder, fsyncs it,
// renames it into place and fsyncs the folder, so a crash or an error never
// leaves a partial object at a path a reference could name.
type FileStore struct {
	dir  string
	root Root
	gen  IDGenerator
}

func openFile(_ context.Context, u *url.URL, opts Options) (PayloadStore, error) {
	if u.Host != "" && u.Host != "localhost" {
		return nil, &Error{Op: "open", Path: u.Redacted(), Err: fmt.Errorf("file store URL must be file:///ABSOLUTE/DIR, got host %q", u.Host)}
	}
	if opts.ReadOnly {
		if st, err := os.Stat(u.Path); err != nil {
			if missingDir(err) {
				err = fmt.Errorf("%w: the store's directory does not exist (%w): name the directory its producers write to", ErrInvalidConfig, err)
			}
			return nil, &Error{Op: "open", Path: u.Path, Err: err}
		} else if !st.IsDir() {
			return nil, &Error{Op: "open", Path: u.Path, Err: fmt.Errorf("%w: not a directory: name a directory", ErrInvalidConfig)}
		}
	}
	if opts.ReadOnly {
		return newFileStore(filepath.Clean(u.Path), opts.IDGenerator), nil
	}
	return NewFileStore(u.Path, opts.IDGenerator)
}

// NewFileStore opens (creating it if needed) the directory dir, which must be
// absolute, and checks that it is writable. gen nil means IDUUID.
//
// A directory that does not exist and cannot be created (a missing or
// read-only parent, a file in the path, /proc/x), or a path that is not a
// directory, is ErrInvalidConfig, as a bucket that does not exist is: the
// URL names no store. A directory that exists but is not writable is only
// a warning (a consumer may read a store mounted read-only): its Publish
// fails with the file system's error, as a bucket's does when the
// credentials may not write.
func NewFileStore(dir string, gen IDGenerator) (*FileStore, error) {
	if !filepath.IsAbs(dir) {
		return nil, &Error{Op: "open", Path: dir, Err: errors.New("file store directory must be an absolute path (file:///abs/dir)")}
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if missingDir(err) {
			err = fmt.Errorf("%w: the store's directory does not exist and cannot be created (%w): name a directory that exists or can be created", ErrInvalidConfig, err)
		}
		return nil, &Error{Op: "open", Path: dir, Err: err}
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		if err == nil || missingDir(err) {
			err = fmt.Errorf("%w: not a directory (%v): name a directory", ErrInvalidConfig, err)
		}
		return nil, &Error{Op: "open", Path: dir, Err: err}
	}
	// A consumer may read a store mounted read-only: an unwritable
	// directory is only a warning here, and Publish fails clearly.
	if probe, err := os.CreateTemp(dir, ".ferry-probe-*"); err != nil {
		slog.Warn("file payload store is not writable: publishing will fail", "dir", dir, "err", err)
	} else {
		probe.Close()
		os.Remove(probe.Name())
	}
	return newFileStore(dir, gen), nil
}

// missingDir reports whether err, from creating or opening a store's
// directory, means that the directory is not there and another attempt will
// not make it so: not found, or an error no retry fixes (permission, a
// read-only file system, a file in the path), unlike a full disk or an I/O
// error.
func missingDir(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || !retryableFSError(err)
}

func newFileStore(dir string, gen IDGenerator) *FileStore {
	if gen == nil {
		gen = IDUUID{}
	}
	root := "file://" + filepath.ToSlash(dir)
	if dir == "/" {
		root = "file://"
	}
	return &FileStore{dir: dir, root: Root(root), gen: gen}
}

func (s *FileStore) Class() string       { return FileStoreClass }
func (s *FileStore) ID(p Payload) string { return s.gen.ID(p) }
func (s *FileStore) Close() error        { return nil }

// Root returns the URL prefix of every full path of this store.
func (s *FileStore) Root() Root { return s.root }

func (s *FileStore) onePass(p Payload) bool { return p.ID != "" || randomIDs(s.gen) }

func (s *FileStore) Publish(ctx context.Context, topic string, p Payload) (PayloadResponse, error) {
	if !s.onePass(p) {
		var err error
		if p, err = hashFirst(ctx, p); err != nil {
			return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(topic), Retryable: !errors.Is(err, ErrPayloadChanged) && retryableFSError(err), Err: err}
		}
	}
	key, err := objectKey(topic, objectID(s.gen, p))
	if err != nil {
		return PayloadResponse{}, err
	}
	fail := func(err error) (PayloadResponse, error) {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Retryable: retryableFSError(err), Err: err}
	}
	dst := filepath.Join(s.dir, filepath.FromSlash(key))
	dir := filepath.Dir(dst)
	if err := s.noSymlinks(dir, key[:strings.LastIndexByte(key, '/')]); err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Err: err}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	if _, err := p.Body.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fail(err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// One pass: the body is read, hashed and written once, and the disk
	// starts writing while the rest is still being copied, so that the
	// fsync below has little left to wait for.
	body := newBodyReader(p)
	if _, err := ctxio.Copy(ctx, startWriteback(tmp), body); err != nil {
		return fail(err)
	}
	sum, err := body.check(p)
	if err != nil {
		return PayloadResponse{}, &Error{Op: "publish", Path: s.root.Path(key), Err: err}
	}
	// os.CreateTemp makes 0600 files; a store shared by producers and
	// consumers running as other users needs them readable, as a plain
	// 0644 file would be.
	if err := tmp.Chmod(objectMode); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fail(err)
	}
	committed = true
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return PayloadResponse{FullPayloadPath: s.root.Path(key), SHA256: sum}, nil
}

func (s *FileStore) file(fullPath, op string) (string, error) {
	key, err := s.root.keyFor(op, fullPath)
	if err != nil {
		return "", err
	}
	name := filepath.Join(s.dir, filepath.FromSlash(key))
	if !inside(s.dir, name) {
		return "", &Error{Op: op, Path: fullPath, Err: ErrInvalidPath}
	}
	// A symbolic link inside the store must lead nowhere else: not
	// outside it, and not to another topic's folder (which would defeat
	// the binding of references to their topic).
	if err := s.noSymlinks(name, key); err != nil {
		return "", &Error{Op: op, Path: fullPath, Err: err}
	}
	return name, nil
}

// noSymlinks checks that name, the file of key (or a folder on its way),
// resolves to exactly the store's directory joined with key: no symbolic
// link anywhere below the store's directory. A name that does not exist
// (yet) is checked up to its deepest existing folder.
func (s *FileStore) noSymlinks(name, key string) error {
	realDir, err := filepath.EvalSymlinks(s.dir)
	if err != nil {
		return fmt.Errorf("%w: the store's directory: %v", ErrInvalidPath, err)
	}
	for {
		real, err := filepath.EvalSymlinks(name)
		if err == nil {
			if real != filepath.Join(realDir, filepath.FromSlash(key)) {
				return fmt.Errorf("%w: a symbolic link in the store leads elsewhere", ErrInvalidPath)
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(key, "/") {
			return nil // nothing of it exists: nothing to follow
		}
		name, key = filepath.Dir(name), key[:strings.LastIndexByte(key, '/')]
	}
}

func (s *FileStore) Download(ctx context.Context, fullPath string) (io.ReadCloser, error) {
	name, err := s.file(fullPath, "download")
	if err != nil {
		return nil, err
	}
	f, err := os.Open(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &Error{Op: "download", Path: fullPath, Err: ErrPayloadNotFound}
		}
		return nil, &Error{Op: "download", Path: fullPath, Retryable: retryableFSError(err), Err: err}
	}
	if st, err := f.Stat(); err == nil && st.IsDir() {
		f.Close()
		return nil, &Error{Op: "download", Path: fullPath, Err: fmt.Errorf("%w: a directory, not an object", ErrPayloadNotFound)}
	}
	return f, nil
}

func (s *FileStore) Delete(_ context.Context, fullPath string) error {
	name, err := s.file(fullPath, "delete")
	if err != nil {
		return err
	}
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return &Error{Op: "delete", Path: fullPath, Retryable: true, Err: err}
	}
	// An emptied shard folder goes too (it fails, harmlessly, when other
	// objects or a concurrent upload's temp file are still in it).
	_ = os.Remove(filepath.Dir(name))
	return nil
}

// inside reports whether name lies below dir.
func inside(dir, name string) bool {
	return dir == "/" || strings.HasPrefix(name, dir+string(filepath.Separator))
}

// retryableFSError: local file-system errors that another attempt cannot
// fix (permissions, read-only, a file where a folder should be, a name too
// long, a symbolic-link loop, a file too large) are fatal.
func retryableFSError(err error) bool {
	for _, fatal := range []error{fs.ErrPermission, syscall.ENOTDIR, syscall.EROFS, syscall.EISDIR,
		syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EINVAL, syscall.EFBIG, syscall.EXDEV} {
		if errors.Is(err, fatal) {
			return false
		}
	}
	return true
}

// List implements Lister: it walks DIR/<topic>, skipping temp files of
// uploads in progress, ferry gc's own folder and anything that is not a
// regular file.
func (s *FileStore) List(ctx context.Context, topic string, fn func(ObjectInfo) error) error {
	prefix, err := TopicPrefix(topic)
	if err != nil {
		return err
	}
	return s.walk(ctx, filepath.Join(s.dir, topic), prefix, false, func(_ string, o ObjectInfo) error { return fn(o) })
}

// name is the file of a raw key (ObjectStore), checked with checkRawKey.
func (s *FileStore) name(op, key string) (string, error) {
	if err := checkRawKey(key); err != nil {
		return "", &Error{Op: op, Path: s.root.Path(key), Err: err}
	}
	return filepath.Join(s.dir, filepath.FromSlash(key)), nil
}

func (s *FileStore) opErr(op, key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &Error{Op: op, Path: s.root.Path(key), Err: ErrPayloadNotFound}
	}
	return &Error{Op: op, Path: s.root.Path(key), Retryable: retryableFSError(err), Err: err}
}

// Stat implements ObjectStore.
func (s *FileStore) Stat(_ context.Context, key string) (ObjectInfo, error) {
	name, err := s.name("stat", key)
	if err != nil {
		return ObjectInfo{}, err
	}
	st, err := os.Lstat(name)
	if err != nil {
		return ObjectInfo{}, s.opErr("stat", key, err)
	}
	if !st.Mode().IsRegular() {
		return ObjectInfo{}, &Error{Op: "stat", Path: s.root.Path(key), Err: fmt.Errorf("%w: not a regular file", ErrPayloadNotFound)}
	}
	return fileInfo(s.root.Path(key), st), nil
}

// fileInfo describes a stored file; Version is its inode and mtime, which
// a rewrite (temp file renamed over it) or a touch changes.
func fileInfo(full string, st fs.FileInfo) ObjectInfo {
	oi := ObjectInfo{FullPath: full, Size: st.Size(), ModTime: st.ModTime()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		oi.Version = fmt.Sprintf("%d:%d", sys.Ino, st.ModTime().UnixNano())
	} else {
		oi.Version = fmt.Sprint(st.ModTime().UnixNano())
	}
	return oi
}

// Copy implements ObjectStore: a hard link (a second name for the same
// bytes; deleting either name leaves the other) placed atomically, with its
// ModTime set to now; a byte copy where links are not possible.
func (s *FileStore) Copy(_ context.Context, src, dst string) error {
	from, err := s.name("copy", src)
	if err != nil {
		return err
	}
	to, err := s.name("copy", dst)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return s.opErr("copy", dst, err)
	}
	tmp := filepath.Join(filepath.Dir(to), ".tmp-link-"+uuid.NewString())
	if err := os.Link(from, tmp); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return s.opErr("copy", src, err)
		}
		if err := copyFile(from, tmp); err != nil {
			os.Remove(tmp)
			return s.opErr("copy", src, err)
		}
	}
	if err := os.Rename(tmp, to); err != nil {
		os.Remove(tmp)
		return s.opErr("copy", dst, err)
	}
	now := time.Now()
	if err := os.Chtimes(to, now, now); err != nil {
		return s.opErr("copy", dst, err)
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, objectMode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Touch implements ObjectStore (the file's mtime becomes now).
func (s *FileStore) Touch(_ context.Context, key string) error {
	name, err := s.name("touch", key)
	if err != nil {
		return err
	}
	now := time.Now()
	if err := os.Chtimes(name, now, now); err != nil {
		return s.opErr("touch", key, err)
	}
	return nil
}

// Move implements ObjectStore with rename(2): atomic.
func (s *FileStore) Move(_ context.Context, src, dst string) error {
	from, err := s.name("move", src)
	if err != nil {
		return err
	}
	to, err := s.name("move", dst)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return s.opErr("move", dst, err)
	}
	if err := os.Rename(from, to); err != nil {
		return s.opErr("move", src, err)
	}
	_ = os.Remove(filepath.Dir(from)) // an emptied folder goes too (fails harmlessly otherwise)
	return nil
}

// Remove implements ObjectStore.
func (s *FileStore) Remove(_ context.Context, key string) error {
	name, err := s.name("delete", key)
	if err != nil {
		return err
	}
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return s.opErr("delete", key, err)
	}
	_ = os.Remove(filepath.Dir(name)) // an emptied folder goes too (fails harmlessly otherwise)
	return nil
}

// ListKeys implements ObjectStore: every regular file under prefix except
// temp files of uploads in progress.
func (s *FileStore) ListKeys(ctx context.Context, prefix string, fn func(string, ObjectInfo) error) error {
	if err := checkRawKey(strings.TrimSuffix(prefix, "/")); err != nil {
		return &Error{Op: "list", Path: s.root.Path(prefix), Err: err}
	}
	top := filepath.Join(s.dir, filepath.FromSlash(prefix))
	return s.walk(ctx, top, prefix, true, fn)
}

// walk calls fn for the regular files below top (key prefix prefix),
// skipping temp files and, unless all, dot folders (gc's own).
func (s *FileStore) walk(ctx context.Context, top, prefix string, all bool, fn func(string, ObjectInfo) error) error {
	var fnErr error
	err := filepath.WalkDir(top, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // the top missing, or deleted meanwhile
			}
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if d.IsDir() {
			if name != top && strings.HasPrefix(d.Name(), ".") && !all {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".tmp-") || (!all && strings.HasPrefix(d.Name(), ".")) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted meanwhile
			}
			return err
		}
		rel, err := filepath.Rel(top, name)
		if err != nil {
			return err
		}
		key := prefix + filepath.ToSlash(rel)
		fnErr = fn(key, fileInfo(s.root.Path(key), info))
		return fnErr
	})
	if err != nil {
		if err == fnErr || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return &Error{Op: "list", Path: s.root.Path(prefix), Retryable: retryableFSError(err), Err: err}
	}
	return nil
}

// Put implements ObjectStore: a temp file, synced and renamed into place.
func (s *FileStore) Put(_ context.Context, key string, b []byte) error {
	name, err := s.name("put", key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return s.opErr("put", key, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(name), ".tmp-*")
	if err != nil {
		return s.opErr("put", key, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return s.opErr("put", key, err)
	}
	if err := tmp.Chmod(objectMode); err != nil {
		tmp.Close()
		return s.opErr("put", key, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return s.opErr("put", key, err)
	}
	if err := tmp.Close(); err != nil {
		return s.opErr("put", key, err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return s.opErr("put", key, err)
	}
	return nil
}

// Get implements ObjectStore.
func (s *FileStore) Get(_ context.Context, key string, max int64) ([]byte, error) {
	name, err := s.name("get", key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, s.opErr("get", key, err)
	}
	defer f.Close()
	return readAtMost(f, max, "get", s.root.Path(key))
}

// readAtMost reads r, failing with ErrObjectTooLarge past max bytes.
func readAtMost(r io.Reader, max int64, op, path string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, &Error{Op: op, Path: path, Retryable: true, Err: err}
	}
	if int64(len(b)) > max {
		return nil, &Error{Op: op, Path: path, Err: fmt.Errorf("%w: more than %d bytes", ErrObjectTooLarge, max)}
	}
	return b, nil
}

// openKey reads the object at key as it is (Confirm's check of a
// quarantined copy); a symbolic link is refused as Download refuses it.
func (s *FileStore) openKey(_ context.Context, key string) (io.ReadCloser, error) {
	name, err := s.name("read", key)
	if err != nil {
		return nil, err
	}
	if err := s.noSymlinks(name, key); err != nil {
		return nil, &Error{Op: "read", Path: s.root.Path(key), Err: err}
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, s.opErr("read", key, err)
	}
	return f, nil
}
