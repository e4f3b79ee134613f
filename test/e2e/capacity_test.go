package e2e

import (
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
