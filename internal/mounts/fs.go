package mounts

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// bucketFS is one bucket mount: a FUSE file system over a Backend with a
// local cache. Reads stream the object into a cache file and are served
// from it as soon as the bytes they need have arrived; writes go to the
// cache file and are uploaded writeback after the last one (at close when
// writeback is 0). Directory listings are cached for dirTTL. Metadata the
// store cannot hold (mode, owner) lives for the mount's lifetime.
type bucketFS struct {
	be         Backend
	cacheDir   string
	journalDir string // see journal.go
	maxCache   int64
	writeback  time.Duration
	readOnly   bool
	log        *slog.Logger

	mu      sync.Mutex
	cached  int64               // bytes of clean cache files
	lru     map[*node]time.Time // clean, closed cache files by last use
	lastErr error
	seq     int64
}

// dirTTL is how long a directory listing is trusted before the store is
// asked again (so objects written by others appear).
const dirTTL = 5 * time.Second

// node is a file or directory of a bucketFS. Its key is its path from the
// root, so a rename moves a subtree without rewriting anything. Fields
// below mu are guarded by it.
type node struct {
	fs.Inode
	fsys *bucketFS
	dir  bool

	mu       sync.Mutex
	cond     *sync.Cond // signalled as a fill makes progress or ends
	size     int64
	mtime    time.Time
	mode     uint32 // permission bits
	uid, gid uint32
	remote   bool // an object exists in the store (files) or marker/prefix (dirs)
	etag     string
	listedAt time.Time // dirs: when the children were last listed

	cache    string // cache file path; "" when not cached
	filling  bool   // a download into cache is running
	have     int64  // bytes of cache valid so far
	complete bool   // cache holds the whole object
	fillErr  error
	dirty    bool
	opens    int
	timer    *time.Timer // pending write-back
	// jname and jkey are n's journal entry (cache file name, key), if any.
	jname, jkey string
}

var (
	_ fs.NodeLookuper  = (*node)(nil)
	_ fs.NodeReaddirer = (*node)(nil)
	_ fs.NodeGetattrer = (*node)(nil)
	_ fs.NodeSetattrer = (*node)(nil)
	_ fs.NodeOpener    = (*node)(nil)
	_ fs.NodeCreater   = (*node)(nil)
	_ fs.NodeReader    = (*node)(nil)
	_ fs.NodeWriter    = (*node)(nil)
	_ fs.NodeFlusher   = (*node)(nil)
	_ fs.NodeReleaser  = (*node)(nil)
	_ fs.NodeFsyncer   = (*node)(nil)
	_ fs.NodeMkdirer   = (*node)(nil)
	_ fs.NodeUnlinker  = (*node)(nil)
	_ fs.NodeRmdirer   = (*node)(nil)
	_ fs.NodeRenamer   = (*node)(nil)
	_ fs.NodeStatfser  = (*node)(nil)
)

func (f *bucketFS) newNode(dir bool, size int64, mtime time.Time, remote bool) *node {
	n := &node{fsys: f, dir: dir, size: size, mtime: mtime, mode: 0o644, remote: remote}
	if dir {
		n.mode = 0o755
	}
	n.cond = sync.NewCond(&n.mu)
	return n
}

// key is n's object key relative to the mount's prefix.
func (n *node) key() string { return n.Path(nil) }

// childKey is the key of n's child name.
func (n *node) childKey(name string) string {
	if k := n.key(); k != "" {
		return k + "/" + name
	}
	return name
}

// fail records err as the mount's health and maps it to an errno.
func (f *bucketFS) fail(op string, err error) syscall.Errno {
	f.mu.Lock()
	f.lastErr = err
	f.mu.Unlock()
	switch {
	case errors.Is(err, errNotFound):
		return syscall.ENOENT
	case errors.Is(err, errDenied):
		f.log.Warn("mount: store refused", "op", op, "err", err)
		return syscall.EACCES
	}
	f.log.Warn("mount: store call failed", "op", op, "err", err)
	return syscall.EIO
}

// health is "" when the last store call succeeded, else its error.
func (f *bucketFS) health() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

func (f *bucketFS) ok() {
	f.mu.Lock()
	f.lastErr = nil
	f.mu.Unlock()
}

// refresh lists dir n again if its listing is older than dirTTL, adding
// children the store has and dropping clean ones it no longer has.
func (n *node) refresh(ctx context.Context) syscall.Errno {
	n.mu.Lock()
	fresh := time.Since(n.listedAt) < dirTTL
	n.mu.Unlock()
	if fresh {
		return 0
	}
	prefix := n.key()
	if prefix != "" {
		prefix += "/"
	}
	objs, dirs, err := n.fsys.be.List(ctx, prefix)
	if err != nil {
		return n.fsys.fail("list "+prefix, err)
	}
	n.fsys.ok()
	seen := map[string]bool{}
	for _, d := range dirs {
		name := strings.TrimSuffix(strings.TrimPrefix(d, prefix), "/")
		if name == "" || strings.Contains(name, "/") {
			continue
		}
		seen[name] = true
		if ch := n.GetChild(name); ch == nil {
			n.AddChild(name, n.NewInode(ctx, n.fsys.newNode(true, 0, time.Now(), true), fs.StableAttr{Mode: fuse.S_IFDIR}), false)
		}
	}
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, prefix)
		if name == "" || strings.HasSuffix(name, "/") || strings.Contains(name, "/") {
			continue // the directory's own marker
		}
		seen[name] = true
		ch := n.GetChild(name)
		if ch == nil {
			nn := n.fsys.newNode(false, o.Size, o.ModTime, true)
			nn.etag = o.ETag
			n.AddChild(name, n.NewInode(ctx, nn, fs.StableAttr{Mode: fuse.S_IFREG}), false)
			continue
		}
		if cn, ok := ch.Operations().(*node); ok && !cn.dir {
			cn.updateRemote(o)
		}
	}
	for name, ch := range n.Children() {
		cn, ok := ch.Operations().(*node)
		if !ok || seen[name] {
			continue
		}
		cn.mu.Lock()
		stale := cn.remote && !cn.dirty && cn.opens == 0 && (!cn.dir || len(ch.Children()) == 0)
		cn.mu.Unlock()
		if stale {
			n.RmChild(name)
		}
	}
	n.mu.Lock()
	n.listedAt = time.Now()
	n.mu.Unlock()
	return 0
}

// updateRemote takes a listing's size and time for a clean file; a
// changed object drops the stale cache.
func (n *node) updateRemote(o Object) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dirty || n.filling {
		return
	}
	if n.etag != o.ETag && n.cache != "" && n.opens == 0 {
		n.dropCacheLocked()
	}
	n.size, n.mtime, n.etag, n.remote = o.Size, o.ModTime, o.ETag, true
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.refresh(ctx); errno != 0 {
		return nil, errno
	}
	ch := n.GetChild(name)
	if ch == nil {
		return nil, syscall.ENOENT
	}
	ch.Operations().(*node).fill(&out.Attr)
	return ch, 0
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if errno := n.refresh(ctx); errno != 0 {
		return nil, errno
	}
	var out []fuse.DirEntry
	for name, ch := range n.Children() {
		out = append(out, fuse.DirEntry{Name: name, Mode: ch.Mode(), Ino: ch.StableAttr().Ino})
	}
	return fs.NewListDirStream(out), 0
}

// fill writes n's attributes.
func (n *node) fill(a *fuse.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	a.Mode = n.mode
	if n.dir {
		a.Mode |= syscall.S_IFDIR
		a.Nlink = 2
	} else {
		a.Mode |= syscall.S_IFREG
		a.Nlink = 1
	}
	a.Size = uint64(n.size)
	a.Blocks = (a.Size + 511) / 512
	a.Blksize = 1 << 20
	a.Owner = fuse.Owner{Uid: n.uid, Gid: n.gid}
	t := n.mtime
	a.SetTimes(&t, &t, &t)
}

func (n *node) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr)
	return 0
}

func (n *node) Setattr(ctx context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if n.fsys.readOnly {
			return syscall.EROFS
		}
		if errno := n.truncate(ctx, int64(sz)); errno != 0 {
			return errno
		}
	}
	n.mu.Lock()
	if m, ok := in.GetMode(); ok {
		n.mode = m & 0o7777
	}
	if u, ok := in.GetUID(); ok {
		n.uid = u
	}
	if g, ok := in.GetGID(); ok {
		n.gid = g
	}
	if t, ok := in.GetMTime(); ok {
		n.mtime = t
	}
	n.mu.Unlock()
	n.fill(&out.Attr)
	return 0
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	const blocks = 1 << 40 / 4096 // an object store has no size; say 1 TiB free
	*out = fuse.StatfsOut{Blocks: blocks, Bfree: blocks, Bavail: blocks, Bsize: 4096, Frsize: 4096, NameLen: 1024, Files: 1 << 30, Ffree: 1 << 30}
	return 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.fsys.readOnly {
		return nil, nil, 0, syscall.EROFS
	}
	nn := n.fsys.newNode(false, 0, time.Now(), false)
	nn.mode = mode & 0o7777
	nn.uid, nn.gid = callerOwner(ctx)
	if errno := nn.resetCacheLocked(); errno != 0 {
		return nil, nil, 0, errno
	}
	nn.dirty, nn.opens = true, 1
	ch := n.NewInode(ctx, nn, fs.StableAttr{Mode: fuse.S_IFREG})
	n.AddChild(name, ch, true)
	nn.fill(&out.Attr)
	nn.mu.Lock()
	nn.scheduleLocked()
	nn.mu.Unlock()
	return ch, &handle{}, 0, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fsys.readOnly {
		return nil, syscall.EROFS
	}
	key := n.childKey(name) + "/"
	if err := n.fsys.be.Put(ctx, key, strings.NewReader(""), 0); err != nil {
		return nil, n.fsys.fail("mkdir "+key, err)
	}
	nn := n.fsys.newNode(true, 0, time.Now(), true)
	nn.mode = mode & 0o7777
	nn.uid, nn.gid = callerOwner(ctx)
	nn.listedAt = time.Now() // new and empty
	ch := n.NewInode(ctx, nn, fs.StableAttr{Mode: fuse.S_IFDIR})
	n.AddChild(name, ch, true)
	nn.fill(&out.Attr)
	return ch, 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.fsys.readOnly {
		return syscall.EROFS
	}
	ch := n.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	cn := ch.Operations().(*node)
	key := n.childKey(name)
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.remote {
		if err := n.fsys.be.Delete(ctx, key); err != nil {
			return n.fsys.fail("delete "+key, err)
		}
	}
	cn.dirty, cn.remote = false, false
	cn.unjournalLocked()
	if cn.timer != nil {
		cn.timer.Stop()
	}
	if cn.opens == 0 {
		cn.dropCacheLocked()
	}
	n.RmChild(name)
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.fsys.readOnly {
		return syscall.EROFS
	}
	ch := n.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	cn := ch.Operations().(*node)
	cn.mu.Lock()
	cn.listedAt = time.Time{}
	cn.mu.Unlock()
	if errno := cn.refresh(ctx); errno != 0 {
		return errno
	}
	if len(ch.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	key := n.childKey(name) + "/"
	if err := n.fsys.be.Delete(ctx, key); err != nil {
		return n.fsys.fail("rmdir "+key, err)
	}
	n.RmChild(name)
	return 0
}

// Rename moves name to newParent/newName. A file's object is copied and
// deleted on the store (a dirty one is uploaded under its new name by its
// write-back); a directory moves every object under it.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.fsys.readOnly {
		return syscall.EROFS
	}
	if flags != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE/NOREPLACE: not on an object store
	}
	ch := n.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	np := newParent.EmbeddedInode().Operations().(*node)
	from, to := n.childKey(name), np.childKey(newName)
	if old := np.GetChild(newName); old != nil {
		if on := old.Operations().(*node); on.dir {
			if len(old.Children()) > 0 {
				return syscall.ENOTEMPTY
			}
			if errno := np.Rmdir(ctx, newName); errno != 0 {
				return errno
			}
		} else if errno := np.Unlink(ctx, newName); errno != 0 && errno != syscall.ENOENT {
			return errno
		}
	}
	cn := ch.Operations().(*node)
	if cn.dir {
		if errno := n.fsys.moveTree(ctx, from+"/", to+"/"); errno != 0 {
			return errno
		}
		rejournalTree(ch, to)
		return 0
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.remote {
		if err := n.fsys.be.Copy(ctx, from, to); err != nil {
			return n.fsys.fail("rename "+from, err)
		}
		if err := n.fsys.be.Delete(ctx, from); err != nil {
			return n.fsys.fail("rename "+from, err)
		}
	}
	if cn.dirty && cn.cache != "" {
		cn.journalLocked(to)
	}
	if cn.dirty && n.fsys.writeback == 0 && cn.opens == 0 {
		// Closed already: nothing else would upload it under its new name.
		defer func() { go cn.upload(context.Background()) }()
	}
	return 0
}

// moveTree moves every object under prefix from to prefix to.
func (f *bucketFS) moveTree(ctx context.Context, from, to string) syscall.Errno {
	objs, err := f.be.ListAll(ctx, from)
	if err != nil {
		return f.fail("rename "+from, err)
	}
	for _, o := range objs {
		dst := to + strings.TrimPrefix(o.Key, from)
		var err error
		if strings.HasSuffix(o.Key, "/") {
			// A directory marker is empty: made anew, not copied (some
			// servers, versitygw's posix backend, refuse to copy one).
			err = f.be.Put(ctx, dst, strings.NewReader(""), 0)
		} else {
			err = f.be.Copy(ctx, o.Key, dst)
		}
		if err != nil {
			return f.fail("rename "+o.Key, err)
		}
		if err := f.be.Delete(ctx, o.Key); err != nil {
			return f.fail("rename "+o.Key, err)
		}
	}
	return 0
}

// callerOwner is the uid and gid of the process making a FUSE call.
func callerOwner(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}
