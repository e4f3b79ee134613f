package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ioWorkload is one install-like job of the I/O matrix: setup builds its
// inputs (not timed), job is timed, both run by /bin/sh as root in the
// default computer. job must leave things so that it can run again.
type ioWorkload struct {
	name, setup, job string
}

// ioWorkloads are what issue 15 measures against a host chroot: untarring
// a tree of many small files (Python's standard library and Perl's
// modules from the image itself), `dpkg -i` of a package set (built with
// dpkg-deb from 8 packages of 400 files each, purged again after each
// run so the next installs anew) and `npm install` of local tarballs
// (20 packages of 150 files, packed with tar as npm pack would, installed
// offline: no registry is reached).
var ioWorkloads = []ioWorkload{
	{
		name: "untar",
		setup: `cd / && tar cf /root/io-src.tar $(ls -d usr/lib/python3.* usr/share/perl* 2>/dev/null) && ` +
			`tar tf /root/io-src.tar | wc -l`,
		job: `rm -rf /root/io-x && mkdir /root/io-x && tar xf /root/io-src.tar -C /root/io-x`,
	},
	{
		name: "dpkg",
		setup: `set -e; rm -rf /root/io-debs; mkdir -p /root/io-debs; for p in 0 1 2 3 4 5 6 7; do
  d=/root/io-debs/src$p; mkdir -p $d/DEBIAN $d/opt/iomatrix/$p
  printf 'Package: iomatrix-%s\nVersion: 1.0\nArchitecture: all\nMaintainer: e2e <e2e@cubicle>\nDescription: I/O matrix package\n' $p > $d/DEBIAN/control
  i=0; while [ $i -lt 400 ]; do mkdir -p $d/opt/iomatrix/$p/d$((i % 20)); head -c $((1024 + (i % 8) * 1024)) /dev/urandom > $d/opt/iomatrix/$p/d$((i % 20))/f$i; i=$((i+1)); done
  dpkg-deb -Zgzip --build $d /root/io-debs/iomatrix-$p.deb >/dev/null; rm -rf $d
done; ls /root/io-debs/*.deb | wc -l`,
		job: `dpkg -i /root/io-debs/*.deb >/dev/null && dpkg -P iomatrix-0 iomatrix-1 iomatrix-2 iomatrix-3 iomatrix-4 iomatrix-5 iomatrix-6 iomatrix-7 >/dev/null`,
	},
	{
		name: "npm",
		setup: `set -e; command -v npm >/dev/null; rm -rf /root/io-npm; mkdir -p /root/io-npm/tgz /root/io-npm/proj; cd /root/io-npm
node -e 'const fs = require("fs"), crypto = require("crypto");
for (let p = 0; p < 20; p++) {
  const d = "src" + p + "/package";
  fs.mkdirSync(d + "/lib", {recursive: true});
  fs.writeFileSync(d + "/package.json", JSON.stringify({name: "iomatrix-" + p, version: "1.0.0", main: "lib/f0.js"}));
  for (let i = 0; i < 150; i++) fs.writeFileSync(d + "/lib/f" + i + ".js", "module.exports = " + i + "; // " + crypto.randomBytes(450).toString("base64") + "\n");
}'
for p in $(seq 0 19); do tar czf tgz/iomatrix-$p.tgz -C src$p package; done; rm -rf src*; ls tgz | wc -l`,
		job: `cd /root/io-npm/proj && rm -rf node_modules package.json package-lock.json && echo '{}' > package.json && ` +
			`npm install --offline --no-audit --no-fund --no-package-lock --silent /root/io-npm/tgz/*.tgz >/dev/null && test -f node_modules/iomatrix-19/lib/f149.js`,
	},
}

// BenchmarkIOMatrix runs each of ioWorkloads inside a gVisor sandbox of
// the default computer and in a host chroot of a second sandbox's own
// rootfs (the same overlay on the same CoW store, so the two differ only
// by gVisor: the baseline issue 15 names), alternating the two so both
// see the same load; -benchtime Nx runs N rounds. Reported per workload:
// the medians and the ratio. The 256 MB
// download row is BenchmarkDownload in internal/runtime/gvisor, which has
// a host peer to download from.
func BenchmarkIOMatrix(b *testing.B) {
	d := startDaemonEnv(b, "gvisor", "", []string{"CUBICLE_DEFAULT_IMAGE=", "CUBICLE_BLUEPRINT_CACHE=" + blueprintCache()})
	m := newIOMatrix(b, d)
	sb, hc := make([][]time.Duration, len(ioWorkloads)), make([][]time.Duration, len(ioWorkloads))
	b.ResetTimer()
	for b.Loop() {
		s, h := m.round(b)
		for i := range ioWorkloads {
			sb[i], hc[i] = append(sb[i], s[i]), append(hc[i], h[i])
		}
	}
	var table []string
	for i, w := range ioWorkloads {
		s, hm := ms(median(sb[i])), ms(median(hc[i]))
		b.ReportMetric(s, w.name+"-sandbox-ms")
		b.ReportMetric(hm, w.name+"-host-ms")
		b.ReportMetric(s/hm, w.name+"-ratio")
		table = append(table, fmt.Sprintf("%-6s %5s inputs  sandbox %8.0f ms  host chroot %8.0f ms  ratio %.2f×", w.name, m.inputs[i], s, hm, s/hm))
	}
	b.ReportMetric(0, "ns/op")
	b.Logf("I/O matrix, medians of %d rounds (gVisor systrap, --overlay2=none, --file-access=exclusive vs host chroot on the same store):\n%s",
		len(sb[0]), strings.Join(table, "\n"))
}

// ioMatrix is the I/O matrix's setup on a daemon that serves the built-in
// default computer: a sandbox of it to run the jobs in, and the merged
// rootfs of a second one for the host chroot, each with every workload's
// inputs built (and checked to be the same).
type ioMatrix struct {
	c      *cubicle.Client
	inside string   // the sandbox's name
	root   string   // the other sandbox's rootfs, on the host
	inputs []string // each workload's setup output (its input count)
}

func newIOMatrix(tb testing.TB, d *daemon) *ioMatrix {
	sn := waitBuiltinDefault(tb, d)
	big := func(r *protocol.CreateSandboxRequest) {
		r.MemBytes, r.FSCapacityBytes = int64p(2<<30), int64p(8<<30)
	}
	m := &ioMatrix{c: d.Client, inside: newSandbox(tb, d.Client, sn.ID, big).Name}
	// Only its rootfs is used, from the host (see hostChroot).
	host := newSandbox(tb, d.Client, sn.ID, big)
	m.root = mergedRootFS(tb, strings.ReplaceAll(host.ID, "-", ""))
	for _, w := range ioWorkloads {
		in := strings.TrimSpace(runLong(tb, m.c, m.inside, asRoot(w.setup)))
		out, _ := hostChroot(tb, m.root, w.setup)
		if h := strings.TrimSpace(out); h != in {
			tb.Fatalf("%s: setups differ: %q vs %q", w.name, in, h)
		}
		m.inputs = append(m.inputs, in)
	}
	return m
}

// round runs each workload in the sandbox, then in the host chroot, and
// returns their times, by workload.
func (m *ioMatrix) round(tb testing.TB) (sandbox, host []time.Duration) {
	for _, w := range ioWorkloads {
		t0 := time.Now()
		runLong(tb, m.c, m.inside, asRoot(w.job))
		sandbox = append(sandbox, time.Since(t0))
		_, took := hostChroot(tb, m.root, w.job)
		host = append(host, took)
	}
	return sandbox, host
}

// runLong is mustRun with room for a job of minutes.
func runLong(tb testing.TB, c *cubicle.Client, name, command string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code, err := c.Exec(ctx, name, cubicle.ExecRequest{Command: command, Shell: "/bin/sh", Timeout: 5 * time.Minute, Stdout: &out, Stderr: &errb})
	if err != nil || code != 0 {
		tb.Fatalf("%q in %s: exit %d, %v: %s %s", command, name, code, err, out.String(), errb.String())
	}
	return out.String()
}

// asRoot wraps script for the default computer, whose commands run as
// "user": through its sudo, as the host chroot runs as root (a few
// milliseconds of a job that takes seconds).
func asRoot(script string) string {
	return "sudo -n sh -c '" + strings.ReplaceAll(script, "'", `'\''`) + "'"
}

// waitBuiltinDefault waits until the daemon's built-in default computer
// is ready (it builds in the background; a warm blueprint cache makes
// that an import) and returns it.
func waitBuiltinDefault(tb testing.TB, d *daemon) protocol.Snapshot {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		sn := builtinDefault(tb, d.Client)
		switch {
		case sn.Status == protocol.SnapshotReady:
			return sn
		case sn.Status != protocol.SnapshotBuilding:
			tb.Fatalf("default is %s: %s", sn.Status, sn.StatusMessage)
		case time.Now().After(deadline):
			tb.Fatalf("default still building after 10 minutes (%d%%: %s)", sn.BuildPercent, sn.BuildStep)
		}
		time.Sleep(time.Second)
	}
}

// mergedRootFS is where the host has the root filesystem of the sandbox
// with internal id (its UUID without dashes) mounted (its overlay's merged
// dir), found in the mount table.
func mergedRootFS(tb testing.TB, id string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.Contains(fields[4], id) && strings.HasSuffix(fields[4], "/rootfs") {
			return fields[4]
		}
	}
	tb.Fatalf("no rootfs mount of sandbox %s", id)
	return ""
}

// hostChroot runs job by /bin/sh in a chroot of root on the host kernel,
// with /proc and /dev bound in a mount namespace of its own (so nothing is
// left mounted in the sandbox's rootfs), and returns its stdout and time.
// The sandbox whose rootfs it is stays idle meanwhile: everything in it
// the matrix uses is written here, on the host, never through its gVisor.
func hostChroot(tb testing.TB, root, job string) (string, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	wrap := `set -e; mount --make-rprivate /; mount --rbind /dev "$1/dev"; mount -t proc proc "$1/proc"; ` +
		`exec chroot "$1" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /bin/sh -c "$2"`
	t0 := time.Now()
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "unshare", "-m", "sh", "-c", wrap, "chroot", root, job)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	took := time.Since(t0)
	if err != nil {
		tb.Fatalf("host chroot %q: %v: %s %s", job, err, out, stderr.String())
	}
	return string(out), took
}
