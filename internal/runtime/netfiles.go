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
	"net/netip"
	"os"
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

// FallbackNameservers serve a sandbox whose host has no nameserver it can
// reach (none at all, or only loopback ones such as systemd-resolved's
// 127.0.0.53, which lives in the host's network namespace), and the
// daemon's own resolver when the host names none.
func FallbackNameservers() []string { return []string{"1.1.1.1", "8.8.8.8"} }

// maxNameservers is how many nameserver lines the resolver reads (glibc's
// MAXNS); more are dropped rather than silently ignored inside.
const maxNameservers = 3

// ResolvConf builds a sandbox's resolv.conf from the host's at hostResolv,
// for every driver: the host's nameservers a sandbox can reach (not
// loopback, not unspecified; at most maxNameservers), else
// FallbackNameservers; its last search line (the one the resolver uses);
// and its options lines. A missing host file gives the fallback.
func ResolvConf(hostResolv string) ([]byte, error) {
	data, err := os.ReadFile(hostResolv)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read host resolv.conf: %w", err)
	}
	var servers, options []string
	search := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			a, err := netip.ParseAddr(f[1])
			if err == nil && !a.IsLoopback() && !a.IsUnspecified() && len(servers) < maxNameservers {
				servers = append(servers, a.String())
			}
		case "search":
			search = strings.Join(f, " ")
		case "options":
			options = append(options, strings.Join(f, " "))
		}
	}
	if len(servers) == 0 {
		servers = FallbackNameservers()
	}
	var b bytes.Buffer
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	for _, l := range append([]string{search}, options...) {
		if l != "" {
			b.WriteString(l + "\n")
		}
	}
	return b.Bytes(), nil
}

// WriteNetFiles installs HostsFile(hostname) and resolv (the driver's
// resolv.conf, from ResolvConf) into the root filesystem at rootfs, following the rules in
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
