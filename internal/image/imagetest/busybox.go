package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// BusyboxPath is where BusyboxImage expects a statically linked busybox
// (Debian's busybox-static).
const BusyboxPath = "/bin/busybox"

// DefaultPath is the PATH in BusyboxImage's config.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// busybox caches the built layer: building reads ~4 MB of host binaries
// and the compressed form is memoised so digests are computed once.
var busybox struct {
	once  sync.Once
	layer v1.Layer
	err   error
}

// BusyboxImage returns a small but real Linux image: the host's static
// busybox with a symlink per applet, the host's /bin/bash with its shared
// libraries and loader at the same paths (the official client runs
// commands through /bin/bash), /etc/passwd and /etc/group with root,
// nobody and app (uid/gid 1000), /tmp (1777), /root and /home/app.
// Config: PATH=DefaultPath, WorkingDir "/". The layer is built once per
// process; the test is skipped if busybox is missing.
func BusyboxImage(t testing.TB) v1.Image {
	t.Helper()
	if _, err := os.Stat(BusyboxPath); err != nil {
		testenv.Skip(t, "imagetest: %s not found (apt-get install busybox-static): %v", BusyboxPath, err)
	}
	busybox.once.Do(func() {
		data, err := busyboxTar(t)
		if err != nil {
			busybox.err = err
			return
		}
		busybox.layer, busybox.err = tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithCompressedCaching)
	})
	if busybox.err != nil {
		t.Fatalf("imagetest: build busybox image: %v", busybox.err)
	}
	return Image(t, v1.Config{
		Env:        []string{"PATH=" + DefaultPath},
		WorkingDir: "/",
	}, busybox.layer)
}

// rootfs accumulates entries by path; later additions replace earlier
// ones, and parents are created implicitly.
type rootfs map[string]Entry

func (r rootfs) add(e Entry) {
	e.Name = strings.TrimPrefix(filepath.Clean("/"+e.Name), "/")
	for d := filepath.Dir(e.Name); d != "." && d != "/"; d = filepath.Dir(d) {
		if _, ok := r[d]; !ok {
			r[d] = Dir(d, 0o755)
		}
	}
	r[e.Name] = e
}

// copyHost adds the host file at p (following symlinks) as a regular file
// at the same path.
func (r rootfs) copyHost(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	r.add(File(p, int64(st.Mode().Perm()), string(b)))
	return nil
}

func (r rootfs) entries() []Entry {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names) // parents sort before children
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		e := r[n]
		if e.Typeflag == tar.TypeDir {
			e.Name += "/"
		}
		out = append(out, e)
	}
	return out
}

func busyboxTar(t testing.TB) ([]byte, error) {
	r := rootfs{}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin", "etc", "dev", "proc", "sys", "run", "var/tmp", "home"} {
		r.add(Dir(d, 0o755))
	}
	r.add(Dir("tmp", 0o1777))
	r.add(Dir("root", 0o700))
	app := Dir("home/app", 0o755)
	app.Uid, app.Gid = 1000, 1000
	r.add(app)

	out, err := exec.Command(BusyboxPath, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		r.add(Symlink(applet, "/bin/busybox"))
	}
	if err := r.copyHost(BusyboxPath); err != nil {
		return nil, err
	}
	if err := r.addBash(); err != nil {
		return nil, err
	}
	r.add(File("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/bash\n"+
		"app:x:1000:1000:app:/home/app:/bin/bash\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	r.add(File("etc/group", 0o644, "root:x:0:\napp:x:1000:\nnogroup:x:65534:\n"))
	r.add(File("etc/hostname", 0o644, "sandbox\n"))
	r.add(File("etc/hosts", 0o644, "127.0.0.1\tlocalhost\n::1\tlocalhost\n"))
	return TarBytes(t, r.entries()...), nil
}

// addBash copies /bin/bash, its loader and libraries (per ldd) to the same
// paths in the image.
func (r rootfs) addBash() error {
	const bash = "/bin/bash"
	if err := r.copyHost(bash); err != nil {
		return err
	}
	out, err := exec.Command("ldd", bash).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", bash, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x…)"; vdso has no path.
		f := strings.Fields(line)
		var p string
		switch {
		case len(f) >= 3 && f[1] == "=>":
			p = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			p = f[0]
		}
		if !strings.HasPrefix(p, "/") {
			continue
		}
		if err := r.copyHost(p); err != nil {
			return fmt.Errorf("copy %s: %w", p, err)
		}
	}
	return nil
}
