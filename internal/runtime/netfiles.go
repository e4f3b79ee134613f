package runtime

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/sandboxfs"
)

// Network files.
//
// /etc/hosts and /etc/resolv.conf are the sandbox's own files: before each
// cold start (never before a restore, whose processes already read them)
// the driver writes them into Spec.RootFS with WriteNetFiles, so they land
// in the sandbox's upper dir, inside its fs_capacity_bytes quota, as
// regular root-owned 0644 files that root inside may edit. They are never
// host files bound in: a sandbox writing to them only fills its own quota.
//
// Edits survive stop/start, while content the daemon owns (the hostname of
// a branch, the host's current nameservers) stays current: NetFilesRecord
// holds the SHA-256 of what Cubicle last wrote to each file, in
// sha256sum(1) format, and a boot rewrites a file only when it is missing,
// when Cubicle never wrote it in this sandbox's lineage (no record: the
// image's file, or one from before this scheme), or when it still hashes
// to the record (nobody edited it since). Once root inside edits a file it
// is the sandbox's; deleting it hands it back. The record is the sandbox's
// to tamper with: the worst it can do is have its own files regenerated.
const NetFilesRecord = "/etc/cubicle/netfiles.sha256"

// Paths of the network files inside a sandbox.
const (
	HostsPath  = "/etc/hosts"
	ResolvPath = "/etc/resolv.conf"
)

// maxNetFile caps what is read of a network file or the record; anything
// bigger (or not a regular file) was made by the sandbox and counts as
// edited.
const maxNetFile = 1 << 20

// HostsFile is the generated /etc/hosts: loopback names plus the
// hostname, so that tools resolving their own hostname do not hang on DNS.
func HostsFile(hostname string) []byte {
	var b bytes.Buffer
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if hostname != "" {
		fmt.Fprintf(&b, "127.0.1.1\t%s\n", hostname)
	}
	return b.Bytes()
}

// WriteNetFiles installs HostsFile(hostname) and resolv (the driver's
// resolv.conf) into the root filesystem at rootfs, following the rules in
// the notes above.
func WriteNetFiles(ctx context.Context, rootfs, hostname string, resolv []byte) error {
	tree, err := sandboxfs.OpenTree(rootfs)
	if err != nil {
		return fmt.Errorf("network files: %w", err)
	}
	defer tree.Close()
	rec := readRecord(ctx, tree)
	changed := false
	for _, f := range []struct {
		path string
		data []byte
	}{{HostsPath, HostsFile(hostname)}, {ResolvPath, resolv}} {
		if !generated(ctx, tree, f.path, rec[f.path]) {
			continue // edited inside: the sandbox's now
		}
		if err := tree.WriteFile(ctx, f.path, f.data, 0o644); err != nil {
			return fmt.Errorf("network files: %w", err)
		}
		if sum := hash(f.data); rec[f.path] != sum {
			rec[f.path], changed = sum, true
		}
	}
	if !changed {
		return nil
	}
	var b bytes.Buffer
	for _, p := range []string{HostsPath, ResolvPath} {
		if rec[p] != "" {
			fmt.Fprintf(&b, "%s  %s\n", rec[p], p)
		}
	}
	if err := tree.WriteFile(ctx, NetFilesRecord, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("network files: %w", err)
	}
	return nil
}

// generated reports whether the file at p may be (re)written: it is
// missing, Cubicle never wrote it (sum is ""), or it still hashes to sum.
// A directory there cannot be replaced: it is the sandbox's.
func generated(ctx context.Context, tree *sandboxfs.Tree, p, sum string) bool {
	if st, err := tree.Lstat(p); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return false
	}
	if sum == "" {
		return true
	}
	cur, err := tree.ReadFile(ctx, p, maxNetFile)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && hash(cur) == sum
}

// readRecord parses NetFilesRecord; unreadable or malformed is empty.
func readRecord(ctx context.Context, tree *sandboxfs.Tree) map[string]string {
	rec := map[string]string{}
	b, err := tree.ReadFile(ctx, NetFilesRecord, maxNetFile)
	if err != nil {
		return rec
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		sum, p, ok := strings.Cut(sc.Text(), "  ")
		if ok && (p == HostsPath || p == ResolvPath) && len(sum) == 2*sha256.Size {
			rec[p] = sum
		}
	}
	return rec
}

func hash(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
