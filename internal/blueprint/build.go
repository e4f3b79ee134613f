package blueprint

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Progress is how far a build is: the step it is at and an estimate of
// the whole build done, 0–100, never decreasing.
type Progress struct {
	Step    string
	Percent int
}

// Builder builds recipes on this host.
type Builder struct {
	// WorkDir holds each build's scratch root filesystem and tarball.
	WorkDir string
	// CacheDir keeps debootstrap's and apt's downloads (and apt's
	// lists) across builds; "" downloads everything every time.
	CacheDir string
	Log      *slog.Logger

	// mu runs one build at a time: builds share CacheDir, whose apt
	// archives a second apt-get would find locked.
	mu sync.Mutex
}

// Result is a finished build.
type Result struct {
	// Rootfs is a tarball of the root filesystem: the built cache's
	// copy when the builder has a CacheDir, else one under Dir (the
	// caller removes Dir, which may be "", once done with it).
	Rootfs string
	Dir    string
	// Packages maps each installed package to its version.
	Packages map[string]string
	// Took is how long the build ran.
	Took time.Duration
	// Cached is true when no build ran: the built cache had it.
	Cached bool
}

// epoch is every file's mtime in the tarball, so two builds of the same
// packages differ only where the packages' own scripts make them differ.
const epoch = "@1700000000"

// Build runs r's recipe — debootstrap (or, for a stacked recipe, its
// base's root filesystem), the chroot script, the tarball — unless the
// built cache holds the tarball of r's key already. progress (may be
// nil) is called from Build's goroutines, in order.
func (b *Builder) Build(ctx context.Context, r Recipe, progress func(Progress)) (*Result, error) {
	rep := newReporter(progress)
	if !b.mu.TryLock() {
		rep.set("waiting for another blueprint build", 0)
		b.mu.Lock()
	}
	defer b.mu.Unlock()
	start := time.Now()
	if err := os.MkdirAll(b.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("blueprint work dir: %w", err)
	}
	c, err := b.cacheDirs()
	if err != nil {
		return nil, err
	}
	res, err := b.build(ctx, r, c, rep)
	if err != nil {
		return nil, err
	}
	res.Took = time.Since(start)
	return res, nil
}

// build is Build under b.mu: a built-cache hit, or a build of r (its base
// first, into the first part of the progress span) that is then kept.
func (b *Builder) build(ctx context.Context, r Recipe, c cache, rep *reporter) (_ *Result, err error) {
	key := r.Key()
	if tarball, pkgs, ok := b.lookupBuilt(key); ok {
		rep.set("found in the built cache", 97)
		return &Result{Rootfs: tarball, Packages: pkgs, Cached: true}, nil
	}
	var base *Result
	if r.Base != nil {
		outer := rep.within(func(s span) span { return s.part(0, 60) })
		base, err = b.build(ctx, *r.Base, c, rep)
		rep.within(func(span) span { return outer.part(60, 100) })
		if err != nil {
			return nil, fmt.Errorf("build base %s: %w", r.Base.Name, err)
		}
		if base.Dir != "" {
			defer os.RemoveAll(base.Dir)
		}
	}
	dir, err := os.MkdirTemp(b.WorkDir, "build-"+r.Name+"-")
	if err != nil {
		return nil, fmt.Errorf("blueprint work dir: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	root := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("blueprint root: %w", err)
	}
	if base != nil {
		rep.set("unpacking "+r.Base.Name, 0)
		unpack := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf", base.Rootfs, "-C", root)
		if err := b.run(unpack, nil, nil); err != nil {
			return nil, fmt.Errorf("unpack base %s: %w", r.Base.Name, err)
		}
		rep.set("unpacked "+r.Base.Name, 25)
	}
	// dpkg (debootstrap's inside the root, then apt's) fsyncs every file
	// it unpacks, which is most of a build's time; a scratch root that is
	// packed into a tarball afterwards needs none of it. The script
	// removes the setting before packing.
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(unsafeIOPath)), 0o755); err != nil {
		return nil, fmt.Errorf("blueprint root: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, unsafeIOPath), []byte("force-unsafe-io\n"), 0o644); err != nil {
		return nil, fmt.Errorf("blueprint root: %w", err)
	}
	if base == nil {
		rep.set("debootstrap "+r.Suite, 0)
		args := []string{"--variant=minbase"}
		if c.debootstrap != "" {
			args = append(args, "--cache-dir="+c.debootstrap)
		}
		args = append(args, r.Suite, root, r.Mirror)
		if err := b.run(exec.CommandContext(ctx, "debootstrap", args...), rep.debootstrapLine, nil); err != nil {
			return nil, fmt.Errorf("debootstrap %s: %w", r.Suite, err)
		}
	}
	if err := b.chroot(ctx, root, c, r.script(), rep); err != nil {
		return nil, fmt.Errorf("install packages: %w", err)
	}
	if err := copyBinaries(root, r.Binaries); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(root, manifestPath))
	if err != nil {
		return nil, fmt.Errorf("read package manifest: %w", err)
	}
	pkgs, err := parseManifest(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	rep.set("packing the root filesystem", 92)
	tarball := filepath.Join(dir, "rootfs.tar")
	if err := b.run(packCommand(ctx, root, tarball), nil, nil); err != nil {
		return nil, fmt.Errorf("pack root filesystem: %w", err)
	}
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("remove build root: %w", err)
	}
	if kept, err := b.keepBuilt(key, tarball, pkgs); err != nil {
		// The build stands without the cache: the next one builds again.
		if b.Log != nil {
			b.Log.Warn("blueprint not kept in the built cache", "name", r.Name, "key", key, "err", err)
		}
	} else if kept != "" {
		tarball = kept
	}
	rep.set("packed", 97)
	return &Result{Rootfs: tarball, Dir: dir, Packages: pkgs}, nil
}

// copyBinaries copies each of bins into root (mode 0755), checking that
// it is still the file the recipe's key names.
func copyBinaries(root string, bins map[string]Binary) error {
	for dst, bin := range bins {
		if err := copyBinary(filepath.Join(root, dst), bin); err != nil {
			return fmt.Errorf("copy %s into the image: %w", bin.Source, err)
		}
	}
	return nil
}

func copyBinary(dst string, bin Binary) error {
	src, err := os.Open(bin.Source)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), src)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	want, err := bin.Digest()
	if err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("it changed since its digest was taken (%s, want %s)", got, want)
	}
	return nil
}

// packCommand writes root as a reproducible tarball: names sorted, numeric
// owners, one mtime, no access or change times.
func packCommand(ctx context.Context, root, out string) *exec.Cmd {
	return exec.CommandContext(ctx, "tar", "--sort=name", "--numeric-owner", "--mtime="+epoch, "--format=posix",
		"--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime", "--xattrs",
		"-C", root, "-cf", out, ".")
}

// cache is where one build's downloads persist ("" each: none).
type cache struct {
	debootstrap, archives, lists string
}

func (b *Builder) cacheDirs() (cache, error) {
	if b.CacheDir == "" {
		return cache{}, nil
	}
	abs, err := filepath.Abs(b.CacheDir)
	if err != nil {
		return cache{}, err
	}
	c := cache{debootstrap: filepath.Join(abs, "debootstrap"), archives: filepath.Join(abs, "apt", "archives"),
		lists: filepath.Join(abs, "apt", "lists")}
	for _, d := range []string{c.debootstrap, filepath.Join(c.archives, "partial"), filepath.Join(c.lists, "partial")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return cache{}, fmt.Errorf("blueprint cache: %w", err)
		}
	}
	return c, nil
}

// chrootWrapper runs in a private mount namespace (so its mounts vanish
// with it, whatever happens): /proc, /dev and the caches mounted into the
// root, then the recipe's script in a chroot. $1 is the root, $2 the
// archives cache, $3 the lists cache, $4 the script.
const chrootWrapper = `set -eu
mount -t proc proc "$1/proc"
mount --rbind /dev "$1/dev"
if [ -n "$2" ]; then mount --bind "$2" "$1/var/cache/apt/archives"; fi
if [ -n "$3" ]; then mount --bind "$3" "$1/var/lib/apt/lists"; fi
exec chroot "$1" /bin/sh -c "$4"`

func (b *Builder) chroot(ctx context.Context, root string, c cache, script string, rep *reporter) error {
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--",
		"/bin/sh", "-c", chrootWrapper, "sh", root, c.archives, c.lists, script)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8"}
	return b.run(cmd, nil, rep.aptStatus)
}

// run runs cmd (made with exec.CommandContext), passing each stdout line to onLine and each line of fd 3
// to onStatus (either may be nil); the tail of its output is in the error.
func (b *Builder) run(cmd *exec.Cmd, onLine, onStatus func(string)) error {
	// The whole process group goes when ctx ends or the daemon dies, and
	// a descendant holding the pipes cannot hold Wait.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	tail := &tailBuffer{max: 4 << 10}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = tail
	var wg sync.WaitGroup
	if onStatus != nil {
		sr, sw, err := os.Pipe()
		if err != nil {
			return err
		}
		defer sr.Close()
		cmd.ExtraFiles = []*os.File{sw}
		wg.Add(1)
		go func() { defer wg.Done(); scanLines(sr, onStatus) }()
		defer sw.Close()
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	if len(cmd.ExtraFiles) > 0 {
		cmd.ExtraFiles[0].Close() // the child holds its own copy
	}
	scanLines(out, func(line string) {
		tail.Write([]byte(line + "\n"))
		if b.Log != nil {
			b.Log.Debug("blueprint", "out", line)
		}
		if onLine != nil {
			onLine(line)
		}
	})
	err = cmd.Wait()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("%s: %w; output ends:\n%s", filepath.Base(cmd.Path), err, tail.String())
	}
	return nil
}

func scanLines(r io.Reader, f func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f(sc.Text())
	}
	io.Copy(io.Discard, r) // a line past the buffer must not block the writer
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// reporter turns the tools' output into Progress: debootstrap is 0–25%,
// apt's list update 25–30%, its downloads 30–50% and its installs
// 50–90%; the percentage never goes back.
type reporter struct {
	mu      sync.Mutex
	f       func(Progress)
	last    Progress
	install bool // apt's update is over: status lines are the install's
	// span is the part of the whole that the build under way reports
	// into (a stacked recipe's base gets the first part).
	span span
}

// span is a range of the overall percentage.
type span struct{ lo, hi int }

// part is the sub-range from..to (percentages of s) of s.
func (s span) part(from, to int) span {
	return span{s.lo + (s.hi-s.lo)*from/100, s.lo + (s.hi-s.lo)*to/100}
}

func newReporter(f func(Progress)) *reporter { return &reporter{f: f, span: span{0, 100}} }

// within moves the reporter to the span f makes of the current one, for
// the next build of a stack (whose apt output is an update's again), and
// returns the span it was in.
func (r *reporter) within(f func(span) span) span {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.span
	r.span, r.install = f(prev), false
	return prev
}

// set reports step at pct percent of the current build (so pct of span).
func (r *reporter) set(step string, pct int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pct = r.span.lo + (r.span.hi-r.span.lo)*pct/100
	pct = min(max(pct, r.last.Percent), 100)
	p := Progress{Step: step, Percent: pct}
	if p == r.last || r.f == nil {
		r.last = p
		return
	}
	r.last = p
	r.f(p)
}

// debootstrapStages are debootstrap's "I:" messages and the percentage
// reached when each begins.
var debootstrapStages = []struct {
	prefix string
	pct    int
}{
	{"I: Retrieving", 2}, {"I: Validating", 4}, {"I: Extracting", 12}, {"I: Installing", 15},
	{"I: Unpacking", 17}, {"I: Configuring", 21}, {"I: Base system installed", 25},
}

func (r *reporter) debootstrapLine(line string) {
	for _, s := range debootstrapStages {
		if strings.HasPrefix(line, s.prefix) {
			r.set("debootstrap: "+strings.TrimPrefix(line, "I: "), s.pct)
			return
		}
	}
}

// installMarker is written to the status fd between apt-get update and
// apt-get install, so the reporter knows whose downloads it sees.
const installMarker = "cubicle:install"

// aptStatus reads one APT::Status-Fd line: "dlstatus:N:PCT:DESC" while
// downloading, "pmstatus:PKG:PCT:DESC" while unpacking and configuring.
func (r *reporter) aptStatus(line string) {
	if line == installMarker {
		r.mu.Lock()
		r.install = true
		r.mu.Unlock()
		r.set("downloading packages", 30)
		return
	}
	parts := strings.SplitN(line, ":", 4)
	if len(parts) < 4 {
		return
	}
	pct, err := strconv.ParseFloat(parts[2], 64)
	if err != nil {
		return
	}
	r.mu.Lock()
	install := r.install
	r.mu.Unlock()
	switch {
	case parts[0] == "dlstatus" && !install:
		r.set("apt-get update: "+parts[3], 25+int(pct*5/100))
	case parts[0] == "dlstatus":
		r.set("downloading packages: "+parts[3], 30+int(pct*20/100))
	case parts[0] == "pmstatus":
		r.set("installing packages: "+parts[3], 50+int(pct*40/100))
	}
}
