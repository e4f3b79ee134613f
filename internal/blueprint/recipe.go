// Package blueprint builds built-in root filesystems from Debian's packages:
// debootstrap of a pinned suite, then apt-get of an explicit package list
// in a chroot, a non-root user, and a reproducible tarball of the result.
// The default computer (Default) is the root filesystem of the snapshot
// named "default" that every workspace boots when it names none.
//
// A build needs root, debootstrap, unshare, chroot and GNU tar on the host
// and reaches the recipe's mirror; downloaded packages are kept in a cache
// directory across builds, so a rebuild downloads only what changed, and
// so are finished builds (cache.go), so a recipe stacked on another
// (Recipe.Base: docker on the default computer, the builder on docker)
// installs only what it adds.
package blueprint

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
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
	// Groups are User's groups besides sudo.
	Groups []string
	// Files are written into the image (path → content, mode 0755) once
	// the packages are in.
	Files map[string]string
	// Binaries are host files copied into the image (path inside →
	// file), after the packages: programs Debian does not package.
	Binaries map[string]Binary
	// Boot is how sandboxes of the snapshot boot (zero: plainly).
	Boot sandbox.BuiltinBoot
	// Base, when set, is the recipe this one is stacked on: the build
	// unpacks Base's finished root filesystem (built first, or taken
	// from the built cache) instead of running debootstrap, and then
	// installs only Packages, adds User to Groups, and writes Files and
	// Binaries. Suite, Mirror and Env are Base's; User is Base's user or
	// "" (the image runs as root; Base's account stays).
	Base *Recipe
}

// Binary is a host file a recipe copies into its image, named in the
// recipe's key by its content's digest. The digest is taken at the first
// use (Key or the copy), not when the daemon starts: hashing BuildKit's
// ~100 MB on every start would delay every start for a snapshot that may
// never be used.
type Binary struct {
	Source string
	digest *lazyDigest // shared by copies of the Binary
}

type lazyDigest struct {
	once sync.Once
	sum  string
	err  error
}

// NewBinary describes host file path, which must be a regular file.
func NewBinary(path string) (Binary, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Binary{}, fmt.Errorf("blueprint binary: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return Binary{}, fmt.Errorf("blueprint binary %s: not a regular file", path)
	}
	return Binary{Source: path, digest: &lazyDigest{}}, nil
}

// Digest is the file's "sha256:…" digest as first read.
func (b Binary) Digest() (string, error) {
	b.digest.once.Do(func() {
		sum, err := fileSHA256(b.Source)
		if err != nil {
			b.digest.err = fmt.Errorf("blueprint binary: %w", err)
			return
		}
		b.digest.sum = "sha256:" + sum
	})
	return b.digest.sum, b.digest.err
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

// dockerdScript is /usr/local/bin/cubicle-dockerd of the docker blueprint:
// the start command that runs dockerd as gVisor's "Docker in gVisor"
// guide does. Docker's own iptables rules are off (gVisor's netstack has
// no nftables and the guide's set-up needs none of them): forwarding on
// and one SNAT rule per protocol out of the sandbox's interface give
// nested containers the sandbox's address, so their connections leave
// through the sandbox's veth and its egress policy, like its own. The
// MTU follows the interface's. dockerd's exit status lands in
// /tmp/cubicle-dockerd.exit, which the probe (--ready) reads: a sandbox without the opt-in is
// ready (with no Docker; the log says why) instead of never.
const dockerdScript = `#!/bin/sh
set -u
exitfile=/tmp/cubicle-dockerd.exit
if [ "${1:-}" = --ready ]; then
  docker info >/dev/null 2>&1 && exit 0
  [ -e "$exitfile" ] && { echo "dockerd exited $(cat "$exitfile"); see /tmp/cubicle-start.log" >&2; exit 0; }
  exit 1
fi
rm -f "$exitfile"
# A persistent sandbox keeps /run across a stop: this boot's dockerd and
# containerd must not take the last boot's pid files for live processes.
rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
dev=$(ip route show default | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -n1)
addr=$(ip -4 -o addr show dev "$dev" | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p' | head -n1)
mtu=$(ip -o link show dev "$dev" | sed -n 's/.* mtu \([0-9]*\).*/\1/p')
if echo 1 >/proc/sys/net/ipv4/ip_forward; then
  for p in tcp udp; do
    iptables-legacy -t nat -C POSTROUTING -o "$dev" -p $p -j SNAT --to-source "$addr" 2>/dev/null ||
      iptables-legacy -t nat -A POSTROUTING -o "$dev" -p $p -j SNAT --to-source "$addr"
  done
fi
dockerd --iptables=false --ip6tables=false ${mtu:+--mtu=$mtu} "$@"
code=$?
echo "$code" >"$exitfile"
exit "$code"
`

// Docker is the default computer with Docker inside: Debian's docker.io
// (dockerd, containerd, runc, the docker CLI) and docker-compose, the
// user in group docker, dockerd started at every boot (cubicle-dockerd)
// — stacked on the default computer's build, so only Docker is installed —
// and the sandbox ready once it answers. Its sandboxes run with Docker
// inside unless their create says otherwise.
func Docker() Recipe {
	base := Default()
	r := base
	r.Name = "docker"
	r.Base = &base
	r.Packages = []string{"docker.io", "docker-compose", "iproute2", "iptables"}
	r.Groups = []string{"docker"}
	r.Files = map[string]string{dockerdPath: dockerdScript}
	r.Boot = sandbox.BuiltinBoot{Docker: true, StartCmd: "sudo " + dockerdPath, ReadyCmd: dockerdPath + " --ready"}
	return r
}

// dockerdPath is where the docker blueprints keep cubicle-dockerd.
const dockerdPath = "/usr/local/bin/cubicle-dockerd"

// DockerfileBuilder is the snapshot the official clients'
// createSnapshotFromDockerfile runs in: the docker blueprint (stacked on
// it, its user account kept) run as root (the clients' build command
// writes under /var/lib and starts buildkitd) with BuildKit's daemon and
// client, buildkitd and buildctl (built from the Go module proxy at the
// version tools/buildkit pins; Debian has no BuildKit), and buildkit-runc,
// the name the clients give buildkitd's OCI worker, for Debian's runc.
func DockerfileBuilder(buildkitd, buildctl Binary) Recipe {
	base := Docker()
	r := base
	r.Name = sandbox.BuilderSnapshot
	r.Base = &base
	r.Packages = nil
	r.User, r.UID, r.Groups = "", 0, nil
	r.Files = map[string]string{"/usr/local/bin/buildkit-runc": "#!/bin/sh\nexec runc \"$@\"\n"}
	r.Binaries = map[string]Binary{"/usr/local/bin/buildkitd": buildkitd, "/usr/local/bin/buildctl": buildctl}
	r.Boot.StartCmd = dockerdPath
	return r
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
	if r.Boot != (sandbox.BuiltinBoot{}) { // absent from older recipes' keys
		fmt.Fprintf(h, "\n%v\n%s\n%s", r.Boot.Docker, r.Boot.StartCmd, r.Boot.ReadyCmd)
	}
	if r.Base != nil {
		fmt.Fprintf(h, "\nbase %s", r.Base.Key())
	}
	for _, p := range slices.Sorted(maps.Keys(r.Binaries)) {
		d, err := r.Binaries[p].Digest()
		if err != nil {
			d = "unreadable" // the build's copy fails on it, naming why
		}
		fmt.Fprintf(h, "\n%s %s", p, d)
	}
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

// unsafeIOPath is the dpkg setting a build runs under (see Build).
const unsafeIOPath = "/etc/dpkg/dpkg.cfg.d/00cubicle-unsafe-io"

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
	if r.Base == nil {
		fmt.Fprintf(&b, "cat >/etc/apt/sources.list <<'EOF'\n%sEOF\n", r.sources())
	}
	b.WriteString("echo 'APT::Keep-Downloaded-Packages \"true\";' >/etc/apt/apt.conf.d/00cubicle-keep\n")
	if r.Base == nil {
		// Documentation is most of a package's bytes and nothing a sandbox
		// reads (no man is installed); licences stay.
		b.WriteString("printf 'path-exclude=/usr/share/doc/*\\npath-include=/usr/share/doc/*/copyright\\npath-exclude=/usr/share/man/*\\npath-exclude=/usr/share/info/*\\n' >/etc/dpkg/dpkg.cfg.d/01cubicle-nodoc\n")
	}
	if len(r.Packages) > 0 {
		b.WriteString("apt-get -o APT::Status-Fd=3 update\n")
		fmt.Fprintf(&b, "echo %s >&3\n", installMarker)
		fmt.Fprintf(&b, "apt-get -o APT::Status-Fd=3 -y --no-install-recommends install %s\n", strings.Join(r.Packages, " "))
	}
	switch {
	case r.Base != nil && r.User != "" && len(r.Groups) > 0:
		// The account is the base's: it only joins the new groups.
		fmt.Fprintf(&b, "usermod --append --groups %s %s\n", strings.Join(r.Groups, ","), r.User)
	case r.Base == nil && r.User != "":
		fmt.Fprintf(&b, "useradd --create-home --shell /bin/bash --uid %d --user-group --groups %s %s\n", r.UID, strings.Join(append([]string{"sudo"}, r.Groups...), ","), r.User)
		fmt.Fprintf(&b, "echo '%s ALL=(ALL) NOPASSWD:ALL' >/etc/sudoers.d/%s && chmod 0440 /etc/sudoers.d/%s\n", r.User, r.User, r.User)
		// Setuid does not work in a sandbox: sudo is the agent's broker
		// (internal/agent ServeSudo), the real one diverted aside.
		fmt.Fprintf(&b, "dpkg-divert --local --rename --divert /usr/bin/sudo.setuid --add /usr/bin/sudo\n")
		fmt.Fprintf(&b, "ln -s %s /usr/bin/sudo\n", runtime.AgentMountPath) // sudo when run by that name
	}
	for _, p := range slices.Sorted(maps.Keys(r.Files)) {
		fmt.Fprintf(&b, "mkdir -p %s && cat >%s <<'CUBICLE_EOF' && chmod 0755 %s\n%sCUBICLE_EOF\n", dirOf(p), p, p, r.Files[p])
	}
	b.WriteString("rm -f /usr/sbin/policy-rc.d /etc/apt/apt.conf.d/00cubicle-keep " + unsafeIOPath + "\n")
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
