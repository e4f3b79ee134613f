package filerec

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Package events are derived from a scan's file changes alone: a scan
// that changed no package file reads nothing. What they read (dpkg's
// status, npm manifests) goes through storage.ReadLayered: the merged
// view of the sandbox's layers, no symlink followed, size-capped.
const (
	dpkgStatus = "var/lib/dpkg/status"
	// dpkgStatusMax caps dpkg's status file (a full desktop's is ~5 MiB).
	dpkgStatusMax = 64 << 20
	// manifestMax caps one package.json.
	manifestMax = 1 << 20
	// maxManifestReads bounds the package.json files one scan reads.
	maxManifestReads = 10000
	// maxPackageEvents bounds the package events of one scan.
	maxPackageEvents = 1000
)

var (
	// site-packages or dist-packages/<name>-<version>.dist-info
	distInfoRe = regexp.MustCompile(`(?:^|/)(?:site|dist)-packages/([^/]+)\.dist-info$`)
	// node_modules/[@scope/]name/package.json, at any depth
	npmManifestRe = regexp.MustCompile(`(?:^|/)node_modules/((?:@[^/]+/)?[^/@.][^/]*)/package\.json$`)
)

// pkgState is what a sandbox's packages were at its last scan, as far as
// scans read them.
type pkgState struct {
	dpkg map[string]string // name → version; nil until first read
	npm  map[string]npmPkg // package.json path → what it held
}

type npmPkg struct{ Name, Version string }

func newPkgState() *pkgState { return &pkgState{npm: map[string]npmPkg{}} }

// pkgEvent is one package event: its type and data.
type pkgEvent struct {
	typ string
	protocol.PackageChange
}

// packages derives changes' package events, dpkg then pip then npm, each
// by name.
func (b *box) packages(ctx context.Context, changes []storage.FileChange) ([]pkgEvent, error) {
	var out []pkgEvent
	var errs []error
	for _, c := range changes {
		if c.Path == "/"+dpkgStatus {
			evs, err := b.dpkgChanges(ctx)
			out, errs = append(out, evs...), append(errs, err)
			break
		}
	}
	out = append(out, pipChanges(changes)...)
	evs, err := b.npmChanges(ctx, changes)
	out, errs = append(out, evs...), append(errs, err)
	if len(out) > maxPackageEvents {
		out = out[:maxPackageEvents]
	}
	return out, errors.Join(errs...)
}

// dpkgChanges compares dpkg's status with what it was: at the last scan
// that read it, or else in the lower layers.
func (b *box) dpkgChanges(ctx context.Context) ([]pkgEvent, error) {
	before := b.pk.dpkg
	if before == nil {
		var err error
		if before, err = b.readDpkg(ctx, b.lowers); err != nil {
			return nil, err
		}
	}
	after, err := b.readDpkg(ctx, b.stack)
	if err != nil {
		return nil, err
	}
	b.pk.dpkg = after
	return versionDiff(protocol.EcosystemDpkg, before, after, nil), nil
}

// readDpkg parses dpkg's status as stack shows it (none: no packages).
func (b *box) readDpkg(ctx context.Context, stack []string) (map[string]string, error) {
	data, err := storage.ReadLayered(ctx, stack, dpkgStatus, dpkgStatusMax)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read dpkg status: %w", err)
	}
	return parseDpkgStatus(data), nil
}

// parseDpkgStatus returns the installed packages of a dpkg status file
// (stanzas of "Field: value" lines) with their versions. Packages removed
// but with their config files left are not installed.
func parseDpkgStatus(data []byte) map[string]string {
	pkgs := map[string]string{}
	var name, version, status string
	flush := func() {
		if f := strings.Fields(status); name != "" && len(f) == 3 && f[2] == "installed" {
			pkgs[name] = version
		}
		name, version, status = "", "", ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || line[0] == ' ' || line[0] == '\t' {
			continue // a continuation line
		}
		switch v = strings.TrimSpace(v); k {
		case "Package":
			name = v
		case "Version":
			version = v
		case "Status":
			status = v
		}
	}
	flush()
	return pkgs
}

// versionDiff lists what going from before to after installed, removed
// and upgraded (any version change), by name; paths gives each name's
// location, when it has one.
func versionDiff(eco string, before, after map[string]string, paths map[string]string) []pkgEvent {
	names := make([]string, 0, len(before)+len(after))
	for n := range after {
		names = append(names, n)
	}
	for n := range before {
		if _, ok := after[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []pkgEvent
	for _, n := range names {
		old, had := before[n]
		now, has := after[n]
		pc := protocol.PackageChange{Ecosystem: eco, Name: n, Version: now, Path: paths[n]}
		switch {
		case !had:
			out = append(out, pkgEvent{protocol.EventPackageInstalled, pc})
		case !has:
			pc.Version = old
			out = append(out, pkgEvent{protocol.EventPackageRemoved, pc})
		case old != now:
			pc.PreviousVersion = old
			out = append(out, pkgEvent{protocol.EventPackageUpgraded, pc})
		}
	}
	return out
}

// pipChanges reads pip's packages from dist-info directories added and
// deleted (a removal and an install of one name in one site-packages dir
// is an upgrade). Names and versions come from the directory name, which
// pip writes as <name>-<version> with '-' in either escaped to '_'.
func pipChanges(changes []storage.FileChange) []pkgEvent {
	// Keyed by site dir and normalised name: one diff for all site dirs.
	before, after, paths := map[string]string{}, map[string]string{}, map[string]string{}
	for _, c := range changes {
		m := distInfoRe.FindStringSubmatch(c.Path)
		if m == nil || c.Kind == storage.Modified {
			continue
		}
		name, version, ok := strings.Cut(m[1], "-")
		if !ok {
			continue
		}
		k := path.Dir(c.Path) + "\x00" + strings.ToLower(name)
		if c.Kind == storage.Added {
			after[k], paths[k] = version, c.Path
		} else if before[k] = version; paths[k] == "" {
			paths[k] = c.Path
		}
	}
	out := versionDiff(protocol.EcosystemPip, before, after, paths)
	for i := range out {
		_, out[i].Name, _ = strings.Cut(out[i].Name, "\x00")
	}
	return out
}

// npmChanges reads npm's packages from node_modules manifests added,
// modified and deleted (global and project trees alike, at any depth).
// A deleted or modified manifest's previous version is what the last scan
// read, or else the lower layers' copy.
func (b *box) npmChanges(ctx context.Context, changes []storage.FileChange) ([]pkgEvent, error) {
	var out []pkgEvent
	var errs []error
	reads := 0
	read := func(stack []string, p string) (npmPkg, bool) {
		if reads >= maxManifestReads {
			return npmPkg{}, false
		}
		reads++
		data, err := storage.ReadLayered(ctx, stack, p, manifestMax)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("read %s: %w", p, err))
			}
			return npmPkg{}, false
		}
		var m npmPkg
		if json.Unmarshal(data, &m) != nil {
			return npmPkg{}, false
		}
		return m, true
	}
	previous := func(p string) (npmPkg, bool) {
		if m, ok := b.pk.npm[p]; ok {
			return m, true
		}
		return read(b.lowers, p)
	}
	for _, c := range changes {
		m := npmManifestRe.FindStringSubmatch(c.Path)
		if m == nil {
			continue
		}
		pc := protocol.PackageChange{Ecosystem: protocol.EcosystemNpm, Name: m[1], Path: path.Dir(c.Path)}
		switch c.Kind {
		case storage.Added, storage.Modified:
			now, ok := read(b.stack, c.Path)
			if !ok {
				continue
			}
			old, had := npmPkg{}, false
			if c.Kind == storage.Modified {
				old, had = previous(c.Path)
			}
			b.pk.npm[c.Path] = now
			if now.Name != "" {
				pc.Name = now.Name
			}
			pc.Version = now.Version
			switch {
			case !had:
				out = append(out, pkgEvent{protocol.EventPackageInstalled, pc})
			case old.Version != now.Version:
				pc.PreviousVersion = old.Version
				out = append(out, pkgEvent{protocol.EventPackageUpgraded, pc})
			}
		case storage.Deleted:
			old, _ := previous(c.Path)
			delete(b.pk.npm, c.Path)
			if old.Name != "" {
				pc.Name = old.Name
			}
			pc.Version = old.Version
			out = append(out, pkgEvent{protocol.EventPackageRemoved, pc})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errors.Join(errs...)
}
