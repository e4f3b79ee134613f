package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestMixedRuntimes runs one daemon serving gvisor (the default) and
// microvm: a sandbox of each, on its own kernel, both answering; the
// microVM keeps its files across stop/start on its runtime; a daemon
// restart re-adopts both; /healthz lists both runtimes; one the daemon
// does not serve is a 422 naming the field and the runtimes served.
func TestMixedRuntimes(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor,microvm", "")
	c := d.Client
	ctx := context.Background()

	in, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Runtime != "gvisor" || len(in.Runtimes) != 2 || in.Runtimes[0].Name != "gvisor" || in.Runtimes[1].Name != "microvm" || in.Runtimes[1].Accelerator == "" {
		t.Fatalf("healthz runtimes: default %q, served %+v", in.Runtime, in.Runtimes)
	}

	sn := readySnapshot(t, c, "mixed", ref)
	g := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "on-gvisor" })
	v := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.Name, r.Runtime, r.MemBytes = "on-vm", "microvm", int64p(256<<20)
	})
	if g.Runtime != "gvisor" || v.Runtime != "microvm" {
		t.Fatalf("runtimes: %s on %q, %s on %q", g.Name, g.Runtime, v.Name, v.Runtime)
	}
	kg := strings.TrimSpace(mustRun(t, c, g.Name, "uname -r"))
	kv := strings.TrimSpace(mustRun(t, c, v.Name, "uname -r"))
	if kg == kv || !strings.HasPrefix(kv, "6.1.") {
		t.Fatalf("uname -r: gvisor %q, microvm %q (want the guest kernel's 6.1.x)", kg, kv)
	}
	t.Logf("one daemon: gvisor reports %s, the microVM %s", kg, kv)

	mustRun(t, c, v.Name, "mkdir -p /work && echo kept > /work/f && sync")
	if err := c.StopSandbox(ctx, v.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.StartSandbox(ctx, v.Name); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, c, v.Name, "cat /work/f; uname -r"); got != "kept\n"+kv+"\n" {
		t.Fatalf("microVM after stop/start: %q", got)
	}
	if got := mustRun(t, c, g.Name, "echo still"); got != "still\n" {
		t.Fatalf("gvisor sandbox: %q", got)
	}

	// A restarted daemon re-adopts each on its own runtime: both are
	// ready before anything wakes them, and answer from the same kernel.
	d.stop()
	d.start()
	c = d.Client
	for name, kernel := range map[string]string{g.Name: kg, v.Name: kv} {
		sb, err := c.GetSandbox(ctx, name)
		if err != nil || sb.Status != protocol.StatusReady || sb.StatusMessage != "" {
			t.Fatalf("%s after a daemon restart: %+v %v", name, sb, err)
		}
		if got := strings.TrimSpace(mustRun(t, c, name, "uname -r")); got != kernel {
			t.Fatalf("%s after a daemon restart runs %q, want %q", name, got, kernel)
		}
	}

	_, err = c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: sn.ID, Name: "on-ns", Runtime: "namespace"})
	wantStatus(t, err, 422)
	var ae *cubicle.APIError
	if !errors.As(err, &ae) || ae.Field != "runtime" || !strings.Contains(ae.Message, "gvisor, microvm") {
		t.Fatalf("unserved runtime refused as %q: %q", ae.Field, ae.Message)
	}
}
