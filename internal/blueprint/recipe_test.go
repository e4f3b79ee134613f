package blueprint

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDefaultRecipe: the default computer is Debian stable, pinned by
// codename, with every tool the issue promises, a user with sudo whose
// home is the working directory, and a UTF-8 locale.
func TestDefaultRecipe(t *testing.T) {
	r := Default()
	if r.Name != "default" || r.Suite != "bookworm" {
		t.Fatalf("default recipe %s on %s; want default on bookworm", r.Name, r.Suite)
	}
	for _, p := range []string{"python3", "python-is-python3", "python3-pip", "python3-venv", "nodejs", "npm", "git", "curl",
		"wget", "ca-certificates", "build-essential", "procps", "jq", "unzip", "less", "sudo"} {
		if !slices.Contains(r.Packages, p) {
			t.Errorf("default recipe lacks %s", p)
		}
	}
	if r.User != "user" || r.Home() != "/home/user" {
		t.Errorf("user %q home %q; want user in /home/user", r.User, r.Home())
	}
	if !slices.Contains(r.Env, "LANG=C.UTF-8") {
		t.Errorf("env %q lacks LANG=C.UTF-8", r.Env)
	}
	s := r.script()
	for _, want := range []string{
		`exit 101\n' >/usr/sbin/policy-rc.d`,               // no service starts in the chroot
		"deb http://deb.debian.org/debian bookworm main\n", // the pinned suite
		"deb http://deb.debian.org/debian-security bookworm-security main\n",
		"--no-install-recommends install " + strings.Join(r.Packages, " ") + "\n",
		"useradd --create-home --shell /bin/bash --uid 1000 --user-group --groups sudo user\n",
		"ln -s /.cubicle/cubicle /usr/bin/sudo\n",
		"user ALL=(ALL) NOPASSWD:ALL",
		"dpkg-query -W -f '${Package}\\t${Version}\\n' >" + manifestPath,
		"rm -f /usr/sbin/policy-rc.d",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	if strings.Index(s, "rm -f /usr/sbin/policy-rc.d") < strings.Index(s, "install ") {
		t.Errorf("policy-rc.d is removed before the install")
	}
}

// TestKey: the key ignores package order and changes with anything that
// changes what is built.
func TestKey(t *testing.T) {
	base := Default()
	shuffled := Default()
	slices.Reverse(shuffled.Packages)
	if base.Key() != shuffled.Key() {
		t.Errorf("package order changed the key")
	}
	for name, change := range map[string]func(*Recipe){
		"suite":    func(r *Recipe) { r.Suite = "trixie" },
		"package":  func(r *Recipe) { r.Packages = append(r.Packages, "vim") },
		"user":     func(r *Recipe) { r.User = "dev" },
		"env":      func(r *Recipe) { r.Env = append(r.Env, "X=1") },
		"revision": func(r *Recipe) { r.Revision++ },
		"mirror":   func(r *Recipe) { r.Mirror = "http://mirror.example/debian" },
	} {
		r := Default()
		change(&r)
		if r.Key() == base.Key() {
			t.Errorf("changing the %s kept the key", name)
		}
	}
}

// TestParseManifest: dpkg-query's lines become a map; a malformed line
// is an error, not a silent gap.
func TestParseManifest(t *testing.T) {
	got, err := parseManifest(strings.NewReader("python3\t3.11.2-1+b1\nnodejs\t18.20.4+dfsg-1~deb12u3\n\n"))
	if err != nil || len(got) != 2 || got["python3"] != "3.11.2-1+b1" || got["nodejs"] != "18.20.4+dfsg-1~deb12u3" {
		t.Fatalf("parseManifest = %v, %v", got, err)
	}
	if _, err := parseManifest(strings.NewReader("python3 3.11\n")); err == nil {
		t.Fatal("a line without a tab parsed")
	}
}

// TestProgress: debootstrap's and apt's output move one percentage that
// never goes back, through the phases in order.
func TestProgress(t *testing.T) {
	var got []Progress
	r := newReporter(func(p Progress) { got = append(got, p) })
	r.debootstrapLine("I: Retrieving InRelease")
	r.debootstrapLine("W: something unrelated")
	r.debootstrapLine("I: Extracting libc6...")
	r.debootstrapLine("I: Base system installed successfully.")
	r.aptStatus("dlstatus:1:50:Retrieving file 1 of 4")
	r.aptStatus(installMarker)
	r.aptStatus("dlstatus:3:50.5:Retrieving file 3 of 300")
	r.aptStatus("pmstatus:gcc-12:80:Installing gcc-12")
	r.aptStatus("dlstatus:garbage")
	r.debootstrapLine("I: Retrieving late") // lower than where we are: the percentage holds
	want := []Progress{
		{"debootstrap: Retrieving InRelease", 2}, {"debootstrap: Extracting libc6...", 12},
		{"debootstrap: Base system installed successfully.", 25}, {"apt-get update: Retrieving file 1 of 4", 27},
		{"downloading packages", 30}, {"downloading packages: Retrieving file 3 of 300", 40},
		{"installing packages: Installing gcc-12", 82}, {"debootstrap: Retrieving late", 82},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("progress:\n got %v\nwant %v", got, want)
	}
}

// TestPackReproducible: packing the same tree twice, with different
// mtimes and creation order, gives the same bytes.
func TestPackReproducible(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pack := func(order []string, mtime time.Time) []byte {
		root := t.TempDir()
		for _, name := range order {
			p := filepath.Join(root, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, mtime, mtime); err != nil {
				t.Fatal(err)
			}
		}
		out := filepath.Join(t.TempDir(), "rootfs.tar")
		if b, err := packCommand(ctx, root, out).CombinedOutput(); err != nil {
			t.Fatalf("pack: %v\n%s", err, b)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	a := pack([]string{"etc/a", "usr/bin/b", "usr/lib/c"}, time.Unix(1, 0))
	b := pack([]string{"usr/lib/c", "etc/a", "usr/bin/b"}, time.Now())
	if !bytes.Equal(a, b) {
		t.Fatalf("two packs of the same tree differ (%d and %d bytes)", len(a), len(b))
	}
}

// TestDockerRecipe: the docker blueprint is stacked on the default
// computer and adds Debian's Docker, its user in group docker (the
// base's account, not a new one), cubicle-dockerd written into the image
// as valid shell, and sandboxes that boot with Docker inside, start
// dockerd and wait for it; its key is its own and follows its base's.
func TestDockerRecipe(t *testing.T) {
	r, def := Docker(), Default()
	if r.Base == nil || r.Base.Key() != def.Key() {
		t.Fatalf("docker recipe's base %v; want the default computer", r.Base)
	}
	for _, p := range []string{"docker.io", "iptables", "iproute2"} {
		if !slices.Contains(r.Packages, p) {
			t.Errorf("docker recipe lacks %s", p)
		}
	}
	s := r.script()
	for _, want := range []string{"usermod --append --groups docker user\n", "cat >/usr/local/bin/cubicle-dockerd <<'CUBICLE_EOF'", "dockerd --iptables=false",
		"--no-install-recommends install docker.io docker-compose iproute2 iptables\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("docker script lacks %q", want)
		}
	}
	for _, unwanted := range []string{"useradd", "sources.list", "build-essential"} {
		if strings.Contains(s, unwanted) {
			t.Errorf("docker script redoes its base's %q", unwanted)
		}
	}
	for name, sh := range map[string]string{"chroot script": s, "cubicle-dockerd": dockerdScript} {
		if out, err := exec.Command("sh", "-n", "-c", sh).CombinedOutput(); err != nil {
			t.Errorf("%s is not valid shell: %v %s", name, err, out)
		}
	}
	if !r.Boot.Docker || !strings.Contains(r.Boot.StartCmd, "cubicle-dockerd") || !strings.Contains(r.Boot.ReadyCmd, "--ready") {
		t.Errorf("docker boot %+v", r.Boot)
	}
	if r.Key() == def.Key() || strings.Contains(def.script(), "docker") {
		t.Error("the docker recipe shares the default's key or script")
	}
	changed := Docker()
	newBase := Default()
	newBase.Revision++
	changed.Base = &newBase
	if changed.Key() == r.Key() {
		t.Error("a change to the base kept the docker recipe's key")
	}
}

// TestDockerfileBuilderRecipe: the builder is the docker blueprint run as
// root with BuildKit copied in (named by digest in its key) and the
// buildkit-runc the official clients ask buildkitd for; a binary that
// changed since its digest was taken is not copied.
func TestDockerfileBuilderRecipe(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "buildkitd")
	if err := os.WriteFile(src, []byte("v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := NewBinary(src)
	if err != nil {
		t.Fatal(err)
	}
	r := DockerfileBuilder(bin, bin)
	if r.Name != "builder" || r.User != "" || !r.Boot.Docker || strings.Contains(r.Boot.StartCmd, "sudo") {
		t.Fatalf("builder recipe %s user %q boot %+v; want builder as root with Docker", r.Name, r.User, r.Boot)
	}
	if r.Base == nil || r.Base.Name != "docker" || len(r.Packages) != 0 {
		t.Fatalf("builder base %v packages %v; want docker's build with nothing more installed", r.Base, r.Packages)
	}
	if s := r.script(); strings.Contains(s, "apt-get") || strings.Contains(s, "useradd") || strings.Contains(s, "usermod") {
		t.Errorf("builder script installs packages or changes accounts:\n%s", s)
	}
	if _, ok := r.Files["/usr/local/bin/buildkit-runc"]; !ok || r.Binaries["/usr/local/bin/buildctl"] != bin {
		t.Fatalf("builder files %v binaries %v", r.Files, r.Binaries)
	}
	otherSrc := filepath.Join(dir, "buildkitd-other")
	if err := os.WriteFile(otherSrc, []byte("v0"), 0o755); err != nil {
		t.Fatal(err)
	}
	other, err := NewBinary(otherSrc)
	if err != nil {
		t.Fatal(err)
	}
	if DockerfileBuilder(other, bin).Key() == r.Key() || Docker().Files["/usr/local/bin/buildkit-runc"] != "" {
		t.Error("a different buildkitd keeps the key, or the builder's files leaked into docker's")
	}
	root := t.TempDir()
	if err := copyBinaries(root, r.Binaries); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "usr/local/bin/buildkitd")); err != nil || string(b) != "v1" {
		t.Fatalf("copied buildkitd: %q %v", b, err)
	}
	if err := os.WriteFile(src, []byte("v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyBinaries(t.TempDir(), r.Binaries); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("copying a changed binary: %v", err)
	}
}
