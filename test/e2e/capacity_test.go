package e2e

import (
	"context"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestFSCapacityEnforced: a sandbox cannot write more than its
// fs_capacity_bytes; the write fails inside with a quota error, the sandbox
// keeps working, and freeing space makes writes work again.
func TestFSCapacityEnforced(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "cap", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.FSCapacityBytes = int64p(64 << 20) })
			out, errOut, code := run(t, d.Client, sb.Name, "dd if=/dev/zero of=/root/big bs=1M count=200 conv=fsync")
			if code == 0 {
				t.Fatalf("wrote 200 MiB into a 64 MiB sandbox: %q %q", out, errOut)
			}
			t.Logf("dd past capacity: exit %d: %s", code, errOut)
			if got := mustRun(t, d.Client, sb.Name, "rm -f /root/big; sync; echo ok > /root/small && cat /root/small"); got != "ok\n" {
				t.Fatalf("after freeing space: %q", got)
			}
		})
	}
}

// TestFullSandboxRestarts: a sandbox that filled its fs_capacity_bytes
// still starts again (the runtime's own files — overlay work dir, CA
// bundle — have a reserve the sandbox cannot take), and once the user
// removes files it can write again, up to the same limit.
func TestFullSandboxRestarts(t *testing.T) {
	ref := testImage(t)
	ctx := context.Background()
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "cap", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.FSCapacityBytes = int64p(32 << 20) })
			if _, _, code := run(t, d.Client, sb.Name, "dd if=/dev/zero of=/root/big bs=1M count=100 conv=fsync; mkdir -p /root/d && for i in $(seq 1 200); do echo x > /root/d/f$i || break; done"); code == 0 {
				t.Fatal("filled past capacity without an error")
			}
			for i := range 2 {
				if err := d.Client.StopSandbox(ctx, sb.Name); err != nil {
					t.Fatal(err)
				}
				if err := d.Client.StartSandbox(ctx, sb.Name); err != nil {
					t.Fatalf("start %d of a full sandbox: %v", i+1, err)
				}
			}
			if got := mustRun(t, d.Client, sb.Name, "rm -rf /root/big /root/d; sync; echo ok > /root/small && cat /root/small"); got != "ok\n" {
				t.Fatalf("after freeing space: %q", got)
			}
			if _, _, code := run(t, d.Client, sb.Name, "dd if=/dev/zero of=/root/big bs=1M count=100 conv=fsync"); code == 0 {
				t.Fatal("the limit is gone after a restart")
			}
		})
	}
}
