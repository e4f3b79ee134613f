package e2e

import (
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestMemoryHogKilledSandboxLives checks, per driver and through the whole
// stack (API → manager → driver → agent), that a command past the
// sandbox's mem_bytes is SIGKILLed (exit 137) while the sandbox, its agent
// and its other processes carry on: under gVisor by the agent's OOM guard,
// which also says why on stderr; under the namespace driver by the kernel.
func TestMemoryHogKilledSandboxLives(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "memguard", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.MemBytes = int64p(64 << 20) })
			mustRun(t, d.Client, sb.Name, "sleep 600 >/dev/null 2>&1 & echo $! > /tmp/bystander")
			_, errOut, code := run(t, d.Client, sb.Name, "dd if=/dev/zero of=/dev/null bs=256M count=1")
			if code != 137 {
				t.Fatalf("hog exited %d (stderr %q), want 137", code, errOut)
			}
			if rt == "gvisor" && !strings.Contains(errOut, "out of memory") {
				t.Errorf("stderr does not say why: %q", errOut)
			}
			if out := mustRun(t, d.Client, sb.Name, "echo alive; kill -0 $(cat /tmp/bystander) && echo bystander"); out != "alive\nbystander\n" {
				t.Fatalf("after the OOM kill: %q", out)
			}
			if out := mustRun(t, d.Client, sb.Name, "dd if=/dev/zero of=/dev/null bs=16M count=10 2>&1 | tail -1"); !strings.Contains(out, "copied") && !strings.Contains(out, "records out") {
				t.Errorf("16 MiB under the limit: %q", out)
			}
		})
	}
}
