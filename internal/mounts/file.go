package mounts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// File data: opens, the streaming fill of the cache, reads, writes,
// write-back and the cache's size bound.

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	write := flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 || flags&syscall.O_TRUNC != 0
	if write && n.fsys.readOnly {
		return nil, 0, syscall.EROFS
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.opens++
	n.fsys.unlru(n)
	if flags&syscall.O_TRUNC != 0 {
		if errno := n.resetCacheLocked(); errno != 0 {
			n.opens--
			return nil, 0, errno
		}
		n.dirty, n.mtime = true, time.Now()
		n.scheduleLocked()
		return &handle{}, 0, 0
	}
	// The kernel's pages stay valid only while the local cache they came
	// from does; a new fill (a first open, or the object changed) drops
	// them.
	keep := uint32(fuse.FOPEN_KEEP_CACHE)
	if n.cache == "" {
		if errno := n.startFillLocked(); errno != 0 {
			n.opens--
			return nil, 0, errno
		}
		keep = 0
	}
	return &handle{}, keep, 0
}

// handle is an open file. The node serves every call; a handle exists so
// that the kernel's release reaches Release (go-fuse drops the release
// of an open that returned no handle) and n.opens stays true.
type handle struct{ _ byte }

// resetCacheLocked gives n an empty cache file: its content is now local.
func (n *node) resetCacheLocked() syscall.Errno {
	n.dropCacheLocked()
	p, err := n.fsys.newCacheFile()
	if err != nil {
		return n.fsys.fail("cache", err)
	}
	n.cache, n.have, n.complete, n.size, n.fillErr = p, 0, true, 0, nil
	return 0
}

// startFillLocked creates n's cache file and starts streaming the object
// into it.
func (n *node) startFillLocked() syscall.Errno {
	p, err := n.fsys.newCacheFile()
	if err != nil {
		return n.fsys.fail("cache", err)
	}
	n.cache, n.have, n.complete, n.fillErr = p, 0, !n.remote || n.size == 0, nil
	if n.complete {
		return 0
	}
	n.filling = true
	key := n.key()
	go n.download(key, p)
	return 0
}

// download streams key into cache file p, advancing n.have as it goes.
func (n *node) download(key, p string) {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err == nil {
		err = n.fsys.be.Get(context.Background(), key, 0, &fillWriter{f: f, n: n, p: p})
		f.Close()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cache != p { // dropped or replaced meanwhile: this fill is moot
		n.cond.Broadcast()
		return
	}
	n.filling = false
	if err != nil {
		n.fillErr = err
		n.fsys.fail("get "+key, err)
	} else {
		n.complete = true
		n.size = n.have
		if n.opens == 0 && !n.dirty {
			n.fsys.addLRU(n) // closed before the last bytes landed
		}
	}
	n.cond.Broadcast()
}

// fillWriter appends to cache file p and publishes progress; it stops
// the download once p is no longer n's cache.
type fillWriter struct {
	f *os.File
	n *node
	p string
}

var errFillMoot = errors.New("cache file replaced during its fill")

func (w *fillWriter) Write(b []byte) (int, error) {
	k, err := w.f.Write(b)
	w.n.mu.Lock()
	if w.n.cache != w.p {
		w.n.mu.Unlock()
		return k, errFillMoot
	}
	w.n.have += int64(k)
	w.n.cond.Broadcast()
	w.n.mu.Unlock()
	return k, err
}

// waitLocked waits until the cache holds [0, end) or the whole object.
func (n *node) waitLocked(end int64) syscall.Errno {
	for !n.complete && n.have < end && n.fillErr == nil {
		n.cond.Wait()
	}
	if n.fillErr != nil && !n.complete && n.have < end {
		return n.fsys.fail("read", n.fillErr)
	}
	return 0
}

func (n *node) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n.mu.Lock()
	if n.cache == "" {
		if errno := n.startFillLocked(); errno != 0 {
			n.mu.Unlock()
			return nil, errno
		}
	}
	errno := n.waitLocked(off + int64(len(dest)))
	p := n.cache
	n.mu.Unlock()
	if errno != 0 {
		return nil, errno
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, n.fsys.fail("cache read", err)
	}
	defer f.Close()
	k, err := f.ReadAt(dest, off)
	if err != nil && err != io.EOF {
		return nil, n.fsys.fail("cache read", err)
	}
	return fuse.ReadResultData(dest[:k]), 0
}

func (n *node) Write(ctx context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if n.fsys.readOnly {
		return 0, syscall.EROFS
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cache == "" {
		if errno := n.startFillLocked(); errno != 0 {
			return 0, errno
		}
	}
	if errno := n.waitLocked(1 << 62); errno != 0 {
		return 0, errno
	}
	f, err := os.OpenFile(n.cache, os.O_WRONLY, 0)
	if err != nil {
		return 0, n.fsys.fail("cache write", err)
	}
	k, err := f.WriteAt(data, off)
	f.Close()
	if err != nil {
		return uint32(k), n.fsys.fail("cache write", err)
	}
	n.size = max(n.size, off+int64(k))
	n.have = n.size
	n.dirty, n.mtime = true, time.Now()
	n.scheduleLocked()
	return uint32(k), 0
}

// truncate sets n's size, fetching the object first.
func (n *node) truncate(ctx context.Context, size int64) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	if size == 0 {
		if errno := n.resetCacheLocked(); errno != 0 {
			return errno
		}
	} else {
		if n.cache == "" {
			if errno := n.startFillLocked(); errno != 0 {
				return errno
			}
		}
		if errno := n.waitLocked(1 << 62); errno != 0 {
			return errno
		}
		if err := os.Truncate(n.cache, size); err != nil {
			return n.fsys.fail("cache truncate", err)
		}
	}
	n.size, n.have, n.dirty, n.mtime = size, size, true, time.Now()
	n.scheduleLocked()
	return 0
}

// scheduleLocked journals dirty n and (re)arms its write-back timer:
// writeback after the last write. With writeback 0 the upload happens at
// flush instead.
func (n *node) scheduleLocked() {
	if _, parent := n.Parent(); parent != nil && n.cache != "" {
		n.journalLocked(n.key())
	}
	if n.fsys.writeback == 0 {
		return
	}
	if n.timer != nil {
		n.timer.Stop()
	}
	n.timer = time.AfterFunc(n.fsys.writeback, func() {
		if errno := n.upload(context.Background()); errno != 0 {
			n.mu.Lock()
			if n.dirty {
				n.scheduleLocked() // retried until it lands
			}
			n.mu.Unlock()
		}
	})
}

// upload stores n's cache as its object if it is dirty. The node is
// locked throughout, so the object is a consistent image of the file.
func (n *node) upload(ctx context.Context) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.uploadLocked(ctx)
}

func (n *node) uploadLocked(ctx context.Context) syscall.Errno {
	if !n.dirty || n.cache == "" {
		return 0
	}
	if _, parent := n.Parent(); parent == nil {
		n.unjournalLocked()
		return 0 // unlinked: nothing to store
	}
	key := n.key()
	f, err := os.Open(n.cache)
	if err != nil {
		return n.fsys.fail("cache read", err)
	}
	defer f.Close()
	if err := n.fsys.be.Put(ctx, key, f, n.size); err != nil {
		return n.fsys.fail("put "+key, err)
	}
	n.fsys.ok()
	n.dirty, n.remote, n.etag = false, true, ""
	n.unjournalLocked()
	if n.timer != nil {
		n.timer.Stop()
		n.timer = nil
	}
	return 0
}

func (n *node) Flush(ctx context.Context, _ fs.FileHandle) syscall.Errno {
	if n.fsys.writeback != 0 {
		return 0
	}
	return n.upload(ctx)
}

func (n *node) Fsync(ctx context.Context, _ fs.FileHandle, _ uint32) syscall.Errno {
	return n.upload(ctx)
}

func (n *node) Release(ctx context.Context, _ fs.FileHandle) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.opens--
	if n.opens == 0 && !n.dirty && n.complete && n.cache != "" {
		n.fsys.addLRU(n)
	}
	return 0
}

func (f *bucketFS) newCacheFile() (string, error) {
	f.mu.Lock()
	f.seq++
	p := filepath.Join(f.cacheDir, fmt.Sprintf("%d", f.seq))
	f.mu.Unlock()
	fh, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	return p, fh.Close()
}

// dropCacheLocked forgets n's cache file (n.mu held).
func (n *node) dropCacheLocked() {
	if n.cache == "" {
		return
	}
	n.fsys.unlru(n)
	n.unjournalLocked()
	os.Remove(n.cache)
	n.cache, n.have, n.complete, n.filling = "", 0, false, false
}

// addLRU makes n's clean cache evictable and evicts the least recently
// used clean files while the cache is over its size. n.mu is held.
func (f *bucketFS) addLRU(n *node) {
	f.mu.Lock()
	if _, ok := f.lru[n]; !ok {
		f.cached += n.size
	}
	f.lru[n] = time.Now()
	var victims []*node
	for f.cached > f.maxCache && len(f.lru) > 1 {
		var oldest *node
		for c, t := range f.lru {
			if c != n && (oldest == nil || t.Before(f.lru[oldest])) {
				oldest = c
			}
		}
		if oldest == nil {
			break
		}
		f.cached -= oldest.size
		delete(f.lru, oldest)
		victims = append(victims, oldest)
	}
	f.mu.Unlock()
	for _, v := range victims {
		go func() {
			v.mu.Lock()
			if v.opens == 0 && !v.dirty {
				v.dropCacheLocked()
			}
			v.mu.Unlock()
		}()
	}
}

// unlru takes n out of the evictable set (it is open or gone).
func (f *bucketFS) unlru(n *node) {
	f.mu.Lock()
	if _, ok := f.lru[n]; ok {
		f.cached -= n.size
		delete(f.lru, n)
	}
	f.mu.Unlock()
}

// flushAll uploads every dirty file under n (at unmount).
func (n *node) flushAll(ctx context.Context) error {
	var errs []error
	for name, ch := range n.Children() {
		cn, ok := ch.Operations().(*node)
		if !ok {
			continue
		}
		if cn.dir {
			errs = append(errs, cn.flushAll(ctx))
		} else if errno := cn.upload(ctx); errno != 0 {
			errs = append(errs, fmt.Errorf("upload %s: %w", n.childKey(name), errno))
		}
	}
	return errors.Join(errs...)
}
