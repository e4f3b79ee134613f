// Package blueprint builds built-in root filesystems from Debian's packages:
// debootstrap of a pinned suite, then apt-get of an explicit package list
// in a chroot, a non-root user, and a reproducible tarball of the result.
// The default computer (Default) is the root filesystem of the snapshot
// named "default" that every workspace boots when it names none.
//
// A build needs root, debootstrap, unshare, chroot and GNU tar on the host
// and reaches the recipe's mirror; downloaded packages are kept in a cache
// directory across builds, so a rebuild downloads only what changed.
package blueprint

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Recipe is what a blueprint installs. Its Key names exactly what it
// builds: a change to any field is a new blueprint, built afresh.
type Recipe struct {
	// Name is the snapshot the blueprint makes ("default").
	Name string
	// Suite is the Debian release, pinned by codename ("bookworm").
	Suite string
	// Mirror is the Debian archive debootstrap and apt fetch from.
	Mirror string
	// SecurityMirror serves Suite's security updates; "" for none.
	SecurityMirror string
	// Packages are installed with apt-get (no recommends), after
	// debootstrap's minbase.
	Packages []string
	// User is the non-root login (passwordless sudo) whose home is the
	// working directory; "" for none.
	User string
	// UID is User's numeric id.
	UID int
	// Env is the image's environment (KEY=VALUE).
	Env []string
	// Revision is bumped when the build changes outside the chroot
	// script (which the key hashes) without a change to the fields above,
	// so the key changes too.
	Revision int
}

// Default is the default computer: Debian stable with Python, Node.js,
// git, a C toolchain and the everyday tools, run as "user" with sudo.
func Default() Recipe {
	return Recipe{
		Name:           "default",
		Suite:          "bookworm",
		Mirror:         "http://deb.debian.org/debian",
		SecurityMirror: "http://deb.debian.org/debian-security",
		Packages: []string{
			"build-essential", "ca-certificates", "curl", "git", "jq", "less", "nodejs", "npm", "procps",
			"python-is-python3", "python3", "python3-pip", "python3-venv", "sudo", "unzip", "wget",
		},
		User: "user",
		UID:  1000,
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LANG=C.UTF-8",
			"LC_ALL=C.UTF-8",
		},
		Revision: 1,
	}
}

// Home is the user's home directory, the image's working directory ("/"
// without a user).
func (r Recipe) Home() string {
	if r.User == "" {
		return "/"
	}
	return "/home/" + r.User
}

// Key identifies the recipe: a hash of every field, in a fixed order, and
// of the chroot script they make. Package order does not matter.
func (r Recipe) Key() string {
	pkgs := slices.Clone(r.Packages)
	slices.Sort(pkgs)
	sorted := r
	sorted.Packages = pkgs
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n%s\n%s\n%d\n%s\n%d\n%s", r.Name, r.Suite, r.Mirror, r.SecurityMirror,
		strings.Join(pkgs, " "), r.User, r.UID, strings.Join(r.Env, "\n"), r.Revision, sorted.script())
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// sources is the chroot's /etc/apt/sources.list: the pinned suite, its
// updates and, when set, its security updates.
func (r Recipe) sources() string {
	var b strings.Builder
	fmt.Fprintf(&b, "deb %s %s main\n", r.Mirror, r.Suite)
	fmt.Fprintf(&b, "deb %s %s-updates main\n", r.Mirror, r.Suite)
	if r.SecurityMirror != "" {
		fmt.Fprintf(&b, "deb %s %s-security main\n", r.SecurityMirror, r.Suite)
	}
	return b.String()
}

// manifestPath is where, inside the image, the installed packages are
// listed (one "name<TAB>version" a line), so a sandbox can read them too.
const manifestPath = "/usr/share/cubicle/packages.tsv"

// script is the shell run in the chroot after debootstrap. apt's status
// lines go to fd 3 (see parseStatus); no service starts (policy-rc.d);
// downloaded packages stay in the bind-mounted cache.
func (r Recipe) script() string {
	var b strings.Builder
	b.WriteString("set -eu\n")
	b.WriteString("export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8\n")
	b.WriteString("printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d\n")
	fmt.Fprintf(&b, "cat >/etc/apt/sources.list <<'EOF'\n%sEOF\n", r.sources())
	b.WriteString("echo 'APT::Keep-Downloaded-Packages \"true\";' >/etc/apt/apt.conf.d/00cubicle-keep\n")
	// Documentation is most of a package's bytes and nothing a sandbox
	// reads (no man is installed); licences stay.
	b.WriteString("printf 'path-exclude=/usr/share/doc/*\\npath-include=/usr/share/doc/*/copyright\\npath-exclude=/usr/share/man/*\\npath-exclude=/usr/share/info/*\\n' >/etc/dpkg/dpkg.cfg.d/01cubicle-nodoc\n")
	b.WriteString("apt-get -o APT::Status-Fd=3 update\n")
	fmt.Fprintf(&b, "echo %s >&3\n", installMarker)
	fmt.Fprintf(&b, "apt-get -o APT::Status-Fd=3 -y --no-install-recommends install %s\n", strings.Join(r.Packages, " "))
	if r.User != "" {
		fmt.Fprintf(&b, "useradd --create-home --shell /bin/bash --uid %d --user-group --groups sudo %s\n", r.UID, r.User)
		fmt.Fprintf(&b, "echo '%s ALL=(ALL) NOPASSWD:ALL' >/etc/sudoers.d/%s && chmod 0440 /etc/sudoers.d/%s\n", r.User, r.User, r.User)
		// Setuid does not work in a sandbox: sudo is the agent's broker
		// (internal/agent ServeSudo), the real one diverted aside.
		fmt.Fprintf(&b, "dpkg-divert --local --rename --divert /usr/bin/sudo.setuid --add /usr/bin/sudo\n")
		fmt.Fprintf(&b, "ln -s %s /usr/bin/sudo\n", runtime.AgentMountPath) // sudo when run by that name
	}
	b.WriteString("rm -f /usr/sbin/policy-rc.d /etc/apt/apt.conf.d/00cubicle-keep\n")
	fmt.Fprintf(&b, "mkdir -p %s && dpkg-query -W -f '${Package}\\t${Version}\\n' >%s\n", dirOf(manifestPath), manifestPath)
	// Whatever differs from build to build without meaning anything.
	b.WriteString("rm -rf /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/debconf/*-old /var/lib/dpkg/*-old /tmp/* /var/tmp/* /root/.cache\n")
	b.WriteString(": >/etc/machine-id\n")
	return b.String()
}

func dirOf(p string) string { return p[:strings.LastIndexByte(p, '/')] }

// parseManifest reads a manifest ("name<TAB>version" lines).
func parseManifest(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		name, version, ok := strings.Cut(line, "\t")
		if !ok || name == "" || version == "" {
			return nil, fmt.Errorf("package manifest line %q: want name<TAB>version", line)
		}
		out[name] = version
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read package manifest: %w", err)
	}
	return out, nil
}
