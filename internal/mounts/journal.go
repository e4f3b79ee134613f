package mounts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hanwen/go-fuse/v2/fs"
)

// The write-back journal keeps pending writes across a daemon crash. A
// dirty file's content is always whole in its cache file (writes wait for
// the fill), so the journal need only say which object each dirty cache
// file is: journal/<cache file name> holds the key. An entry is written
// when a file becomes dirty or its key changes (a rename), and removed
// once the object is stored or the file is gone. Only mounts with
// writeback_seconds keep one: with 0 a file is stored when closed, and one
// a crash left unclosed is not published. When the mount is served
// again, replayJournal uploads what the entries name before the cache is
// cleared. Writes are not fsynced: the journal survives the daemon's
// death (kill -9), not the host's.

// journalLocked records n (dirty, n.mu held) as the pending content of key.
// A failure to record is logged: the write stands, only its survival of a
// crash is lost.
func (n *node) journalLocked(key string) {
	if n.fsys.writeback == 0 {
		return
	}
	name := filepath.Base(n.cache)
	if n.jname == name && n.jkey == key {
		return
	}
	n.unjournalLocked()
	p := filepath.Join(n.fsys.journalDir, name)
	err := os.WriteFile(p+".tmp", []byte(key), 0o600)
	if err == nil {
		err = os.Rename(p+".tmp", p)
	}
	if err != nil {
		n.fsys.log.Warn("mount: cannot journal a pending write; it is lost if the daemon dies before its upload", "key", key, "err", err)
		return
	}
	n.jname, n.jkey = name, key
}

// unjournalLocked drops n's journal entry (uploaded, unlinked or replaced).
func (n *node) unjournalLocked() {
	if n.jname == "" {
		return
	}
	os.Remove(filepath.Join(n.fsys.journalDir, n.jname))
	n.jname, n.jkey = "", ""
}

// rejournalTree records the dirty files under directory inode d under
// their keys below prefix (d was renamed to prefix).
func rejournalTree(d *fs.Inode, prefix string) {
	for name, ch := range d.Children() {
		cn, ok := ch.Operations().(*node)
		switch {
		case !ok:
		case cn.dir:
			rejournalTree(ch, prefix+"/"+name)
		default:
			cn.mu.Lock()
			if cn.dirty && cn.cache != "" {
				cn.journalLocked(prefix + "/" + name)
			}
			cn.mu.Unlock()
		}
	}
}

// replayJournal uploads what a previous server of the mount at dir left
// pending (journal/ naming files of cache/), removing each entry once its
// object is stored. On a failure the rest stays for the next attempt.
func replayJournal(ctx context.Context, be Backend, dir string, log *slog.Logger) error {
	jdir := filepath.Join(dir, "journal")
	entries, err := os.ReadDir(jdir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("write-back journal: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(jdir, e.Name())
		if strings.HasSuffix(e.Name(), ".tmp") {
			os.Remove(p) // never completed: its file was not yet dirty
			continue
		}
		if err := replayEntry(ctx, be, p, filepath.Join(dir, "cache", e.Name())); err != nil {
			return err
		}
		log.Info("mount: uploaded a write pending from before the daemon restarted", "entry", e.Name())
	}
	return nil
}

func replayEntry(ctx context.Context, be Backend, entry, cache string) error {
	key, err := os.ReadFile(entry)
	if err != nil {
		return fmt.Errorf("write-back journal: %w", err)
	}
	f, err := os.Open(cache)
	if errors.Is(err, os.ErrNotExist) {
		return os.Remove(entry) // nothing left to store
	}
	if err != nil {
		return fmt.Errorf("write-back journal: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("write-back journal: %w", err)
	}
	if err := be.Put(ctx, string(key), f, st.Size()); err != nil {
		return fmt.Errorf("upload %s, pending from before the daemon restarted: %w", key, err)
	}
	return os.Remove(entry)
}

// hasPending says whether the mount at dir has journal entries left.
func hasPending(dir string) bool {
	entries, _ := os.ReadDir(filepath.Join(dir, "journal"))
	return len(entries) > 0
}
