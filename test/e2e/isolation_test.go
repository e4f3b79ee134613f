package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// hostListener accepts (and immediately closes) connections on addr and
// counts them, so a test can prove a connection never arrived.
func hostListener(t *testing.T, addr string) (port int, accepted func() int) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	n := make(chan int, 1)
	n <- 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			n <- (<-n) + 1
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, func() int { v := <-n; n <- v; return v }
}

// TestIsolation checks, for each driver, that from inside a sandbox the
// host's files, processes, the daemon's data dir, host listeners and other
// sandboxes are unreachable, and that resource limits hold.
func TestIsolation(t *testing.T) {
	ref := testImage(t)
	for _, rt := range withMicroVM() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			c := d.Client
			sn := readySnapshot(t, c, "iso", ref)
			a := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "iso-a"; r.MemBytes = int64p(128 << 20) })
			b := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "iso-b" })

			t.Run("host files", func(t *testing.T) {
				marker := fmt.Sprintf("cubicle-host-marker-%d", time.Now().UnixNano())
				hostFile := filepath.Join("/root", marker)
				if err := os.WriteFile(hostFile, []byte("host secret"), 0o600); err != nil {
					t.Fatal(err)
				}
				defer os.Remove(hostFile)
				out, _, _ := run(t, c, a.Name, "cat /root/"+marker+"; find / -path /proc -prune -o -path /sys -prune -o -name '"+marker+"' -print 2>/dev/null")
				if strings.Contains(out, "host secret") || strings.Contains(out, marker) {
					t.Fatalf("host file visible inside: %q", out)
				}
			})
			t.Run("daemon data dir", func(t *testing.T) {
				out, _, code := run(t, c, a.Name, "ls "+d.dataDir+" 2>&1; find / -path /proc -prune -o -name cubicle.db -print 2>/dev/null")
				if code == 0 && strings.Contains(out, "cubicle.db") {
					t.Fatalf("daemon data visible inside: %q", out)
				}
				if strings.Contains(out, "cubicle.db") || strings.Contains(out, "admin.key") {
					t.Fatalf("daemon data visible inside: %q", out)
				}
			})
			t.Run("host processes", func(t *testing.T) {
				tag := fmt.Sprintf("%d", 400000+time.Now().UnixNano()%100000)
				p := exec.Command("sleep", tag)
				if err := p.Start(); err != nil {
					t.Fatal(err)
				}
				defer func() { p.Process.Kill(); p.Wait() }()
				out := mustRun(t, c, a.Name, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'")
				if strings.Contains(out, "sleep"+" "+tag) || strings.Contains(out, "cubicle serve") {
					t.Fatalf("host processes visible inside: %q", out)
				}
			})
			t.Run("host network", func(t *testing.T) {
				lport, lcount := hostListener(t, "127.0.0.1:0")
				aport, acount := hostListener(t, "0.0.0.0:0")
				script := fmt.Sprintf(`gw=$(ip route | awk '/default/ {print $3}'); echo gw=$gw
for target in 127.0.0.1:%d $gw:%d $gw:%d %s; do
  h=${target%%:*}; p=${target##*:}
  if echo x | nc -w 2 $h $p >/dev/null 2>&1; then echo "OPEN $target"; else echo "closed $target"; fi
done`, lport, aport, lport, strings.TrimPrefix(d.Endpoint, "http://"))
				out := mustRun(t, c, a.Name, script)
				if strings.Contains(out, "OPEN") || lcount() != 0 || acount() != 0 || !strings.Contains(out, "gw=10.") {
					t.Fatalf("host reachable from inside:\n%s (accepted %d/%d)", out, lcount(), acount())
				}
			})
			t.Run("other sandbox", func(t *testing.T) {
				mustRun(t, c, b.Name, "echo b-secret > /root/b-only")
				bip := strings.TrimSpace(mustRun(t, c, b.Name, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"))
				out, _, _ := run(t, c, a.Name, "cat /root/b-only 2>/dev/null; find / -path /proc -prune -o -name b-only -print 2>/dev/null; if echo x | nc -w 2 "+bip+" 49983 >/dev/null 2>&1; then echo OPEN; fi")
				if strings.Contains(out, "b-secret") || strings.Contains(out, "b-only") || strings.Contains(out, "OPEN") || bip == "" {
					t.Fatalf("sandbox b reachable from a (b ip %q): %q", bip, out)
				}
			})
			// Not on microvm: root there keeps CAP_SYS_ADMIN of the guest's
			// own kernel (TestOwnKernel checks what it lacks).
			capabilities := func(t *testing.T) {
				// The gvisor agent holds CAP_SYS_ADMIN for itself (it sets a
				// claimed instance's hostname); its commands must not: it
				// would let root remount, set the hostname, and lift
				// RLIMIT_NPROC (the fork-bomb bound) off every process.
				out := mustRun(t, c, a.Name, "grep -E '^Cap(Eff|Prm|Bnd|Inh|Amb):' /proc/self/status; hostname evil-name 2>&1 && echo SETHOSTNAME-OK; mkdir -p /tmp/m && mount -t tmpfs none /tmp/m 2>&1 && echo MOUNT-OK; true")
				const sysAdmin = 21
				for _, line := range strings.Split(out, "\n") {
					k, v, ok := strings.Cut(line, ":")
					if !ok || !strings.HasPrefix(k, "Cap") {
						continue
					}
					mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
					if err != nil {
						t.Fatalf("%s: %v", line, err)
					}
					if mask&(1<<sysAdmin) != 0 {
						t.Errorf("a command holds CAP_SYS_ADMIN in %s (%s)", k, strings.TrimSpace(v))
					}
				}
				if strings.Contains(out, "SETHOSTNAME-OK") || strings.Contains(out, "MOUNT-OK") || !strings.Contains(out, "CapBnd") {
					t.Errorf("root inside could set the hostname or mount:\n%s", out)
				}
			}
			if rt != "microvm" {
				t.Run("capabilities", capabilities)
			}
			t.Run("memory hog", func(t *testing.T) {
				mustRun(t, c, a.Name, "echo kept > /root/before-hog")
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				code, err := c.Exec(ctx, a.Name, cubicle.ExecRequest{Command: `x=$(head -c 400000000 /dev/zero | tr '\0' a); echo ${#x}`, Shell: "/bin/bash", Timeout: 60 * time.Second, Stdout: io.Discard, Stderr: io.Discard})
				if err == nil && code == 0 {
					t.Fatal("a 400 MB allocation succeeded under a 128 MiB limit")
				}
				t.Logf("hog ended: code %d err %v", code, err)
				// The hog is gone; the sandbox answers and its files are intact.
				if out := mustRun(t, c, a.Name, "cat /root/before-hog"); out != "kept\n" {
					t.Fatalf("sandbox after hog: %q", out)
				}
				if out := mustRun(t, c, b.Name, "echo alive"); out != "alive\n" {
					t.Fatalf("other sandbox after hog: %q", out)
				}
			})
			t.Run("fork bomb", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				var out bytes.Buffer
				_, err := c.Exec(ctx, b.Name, cubicle.ExecRequest{Command: `bomb() { bomb | bomb & }; bomb`, Shell: "/bin/bash", Timeout: 15 * time.Second, Stdout: &out, Stderr: &out})
				t.Logf("fork bomb ended: %v", err)
				if got := mustRun(t, c, a.Name, "echo alive"); got != "alive\n" {
					t.Fatalf("other sandbox after fork bomb: %q", got)
				}
				fresh := newSandbox(t, c, sn.ID, nil)
				if got := mustRun(t, c, fresh.Name, "echo fresh"); got != "fresh\n" {
					t.Fatalf("new sandbox after fork bomb: %q", got)
				}
			})
		})
	}
}
