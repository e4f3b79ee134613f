package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// restartSandbox stops and starts sandbox name and waits until it is
// ready again, failing t if that takes more than a minute.
func restartSandbox(t *testing.T, d *daemon, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Client.StopSandbox(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := d.Client.StartSandbox(ctx, name); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Client.WaitSandbox(ctx, name)
	if err != nil || sb.Status != protocol.StatusReady {
		t.Fatalf("sandbox %s after restart: %v, %v", name, sb, err)
	}
}

// daemonPeakRSS is the daemon process's peak resident set (VmHWM), bytes.
func daemonPeakRSS(t *testing.T, d *daemon) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("daemon gone: %v\n%s", err, d.logs.String())
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<daemon>/status")
	return 0
}

// upperDir is where sandbox sb's writes land on the host.
func upperDir(d *daemon, sb *protocol.Sandbox) string {
	return filepath.Join(d.dataDir, "cow", "sandboxes", strings.ReplaceAll(sb.ID, "-", ""), "upper")
}

// TestHostileCABundle: every boot reads the sandbox's CA bundle to add the
// egress CA. A sandbox that makes it a 100 GiB sparse file used to OOM the
// daemon on its next boot (and after every daemon restart), and a FIFO
// there wedged the boot for good. Now the boot succeeds, the odd bundle is
// skipped, the CA is still installed at the Cubicle paths (in branches
// too), and the daemon's memory stays bounded.
func TestHostileCABundle(t *testing.T) {
	ref := testImage(t)
	const bundle = "/etc/ssl/certs/ca-certificates.crt"
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "ca", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "ca-hostile" })
			for _, attack := range []struct{ name, cmd string }{
				{"sparse-100G", "mkdir -p /etc/ssl/certs && rm -f " + bundle + " && truncate -s 100G " + bundle + " && stat -c %s " + bundle},
				{"fifo", "rm -f " + bundle + " && mkfifo " + bundle + " && stat -c %F " + bundle},
			} {
				t.Run(attack.name, func(t *testing.T) {
					t.Logf("inside: %s", strings.TrimSpace(mustRun(t, d.Client, sb.Name, attack.cmd)))
					if fi, err := os.Lstat(filepath.Join(upperDir(d, sb), bundle)); err == nil {
						t.Logf("on the host: %s, %d bytes", fi.Mode().Type(), fi.Size())
					}
					t0 := time.Now()
					restartSandbox(t, d, sb.Name)
					t.Logf("restart took %s", time.Since(t0))
					if got := mustRun(t, d.Client, sb.Name, "grep -c 'BEGIN CERTIFICATE' /etc/cubicle/ca-bundle.crt /usr/local/share/ca-certificates/cubicle-egress.crt"); got != "/etc/cubicle/ca-bundle.crt:1\n/usr/local/share/ca-certificates/cubicle-egress.crt:1\n" {
						t.Errorf("CA files after restart: %q", got)
					}
					resp, err := http.Get(d.Endpoint + "/healthz")
					if err != nil {
						t.Fatalf("daemon down: %v\n%s", err, d.logs.String())
					}
					resp.Body.Close()
					// A branch boots over the captured bundle just as well.
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					cap, err := d.Client.CaptureSnapshot(ctx, sb.Name, protocol.CaptureSnapshotRequest{Name: "ca-" + attack.name})
					if err != nil {
						t.Fatal(err)
					}
					br := newSandbox(t, d.Client, cap.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "ca-branch-" + attack.name })
					if got := mustRun(t, d.Client, br.Name, "grep -c 'BEGIN CERTIFICATE' /etc/cubicle/ca-bundle.crt"); got != "1\n" {
						t.Errorf("CA bundle in the branch: %q", got)
					}
					if rss := daemonPeakRSS(t, d); rss > 512<<20 {
						t.Errorf("daemon peak RSS %d MiB", rss>>20)
					} else {
						t.Logf("daemon peak RSS %d MiB", rss>>20)
					}
				})
			}
		})
	}
}

// TestNetFilesInSandboxQuota: /etc/hosts and /etc/resolv.conf used to be
// host files in the driver's state dir bound into the namespace sandbox,
// so writing to them filled the host's disk past the sandbox's quota. Now
// they are the sandbox's own files: writes stop at fs_capacity_bytes,
// nothing lands outside its tree, root inside can edit them, and edits
// survive a stop and start; unedited, a branch's /etc/hosts names the
// branch.
func TestNetFilesInSandboxQuota(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "net", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) {
				r.Name = "net-files"
				r.FSCapacityBytes = int64p(128 << 20)
			})
			t.Run("branch hostname", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				cap, err := d.Client.CaptureSnapshot(ctx, sb.Name, protocol.CaptureSnapshotRequest{Name: "net-cap"})
				if err != nil {
					t.Fatal(err)
				}
				br := newSandbox(t, d.Client, cap.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "net-branch" })
				if got := mustRun(t, d.Client, br.Name, "cat /etc/hosts"); !strings.Contains(got, "net-branch") || strings.Contains(got, "net-files") {
					t.Errorf("branch /etc/hosts = %q; want the branch's hostname only", got)
				}
			})
			t.Run("edits survive restart", func(t *testing.T) {
				mustRun(t, d.Client, sb.Name, "printf '127.0.0.1 localhost\\n10.1.2.3 edited.example\\n' > /etc/hosts && echo 'nameserver 10.1.2.4' > /etc/resolv.conf")
				if got := mustRun(t, d.Client, sb.Name, "stat -c %u:%a:%F /etc/hosts /etc/resolv.conf"); got != "0:644:regular file\n0:644:regular file\n" {
					t.Errorf("owner:mode:type = %q", got)
				}
				restartSandbox(t, d, sb.Name)
				if got := mustRun(t, d.Client, sb.Name, "cat /etc/hosts /etc/resolv.conf"); got != "127.0.0.1 localhost\n10.1.2.3 edited.example\nnameserver 10.1.2.4\n" {
					t.Errorf("after restart: %q; want the edits", got)
				}
			})
			t.Run("quota", func(t *testing.T) {
				before := sizeOutsideStore(t, d.dataDir)
				out, errOut, code := run(t, d.Client, sb.Name, "dd if=/dev/zero of=/etc/hosts bs=1M count=1024 conv=fsync")
				if code == 0 {
					t.Fatalf("wrote 1 GiB to /etc/hosts in a 128 MiB sandbox: %q %q", out, errOut)
				}
				t.Logf("dd into /etc/hosts: exit %d: %s", code, strings.TrimSpace(errOut))
				fi, err := os.Stat(filepath.Join(upperDir(d, sb), "etc/hosts"))
				if err != nil || fi.Size() > 128<<20 {
					t.Errorf("upper/etc/hosts: %v, %v; want it in the upper dir, within the quota", fi, err)
				}
				if after := sizeOutsideStore(t, d.dataDir); after-before > 16<<20 {
					t.Errorf("data dir outside the sandbox store grew by %d MiB", (after-before)>>20)
				}
			})
		})
	}
}

// sizeOutsideStore sums the apparent sizes of the regular files under
// dataDir except the copy-on-write store (the sandboxes' trees and its
// loop image), the images and anything mounted (the rootfs mounts): state
// files, the database, driver state dirs.
func sizeOutsideStore(t *testing.T, dataDir string) int64 {
	t.Helper()
	var root syscall.Stat_t
	if err := syscall.Stat(dataDir, &root); err != nil {
		t.Fatal(err)
	}
	var total int64
	err := filepath.WalkDir(dataDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		switch p {
		case filepath.Join(dataDir, "cow"), filepath.Join(dataDir, "store.btrfs"), filepath.Join(dataDir, "images"):
			return filepath.SkipDir
		}
		var st syscall.Stat_t
		if e.IsDir() && syscall.Lstat(p, &st) == nil && st.Dev != root.Dev {
			return filepath.SkipDir
		}
		if e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}
