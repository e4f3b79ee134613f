package e2e

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestRestartKeepsSandbox kills the daemon with SIGKILL while a sandbox has
// files, starts it again, and checks the sandbox and its files are there.
func TestRestartKeepsSandbox(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "restart", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "keeper" })
			ctx := context.Background()
			if err := d.Client.WriteFile(ctx, sb.Name, "/root/notes.txt", strings.NewReader("survives kill -9\n")); err != nil {
				t.Fatal(err)
			}
			mustRun(t, d.Client, sb.Name, "mkdir -p /opt/pkg && echo installed > /opt/pkg/marker")

			d.kill9()
			d.restart()

			got, err := d.Client.GetSandbox(ctx, "keeper")
			if err != nil {
				t.Fatalf("sandbox gone after restart: %v", err)
			}
			if got.ID != sb.ID {
				t.Fatalf("sandbox id changed: %s → %s", sb.ID, got.ID)
			}
			rc, err := d.Client.ReadFile(ctx, "keeper", "/root/notes.txt")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if string(b) != "survives kill -9\n" {
				t.Fatalf("file after restart: %q", b)
			}
			if out := mustRun(t, d.Client, "keeper", "cat /opt/pkg/marker"); out != "installed\n" {
				t.Fatalf("marker after restart: %q", out)
			}

			// Stop/start keeps the filesystem too.
			if err := d.Client.StopSandbox(ctx, "keeper"); err != nil {
				t.Fatal(err)
			}
			if err := d.Client.StartSandbox(ctx, "keeper"); err != nil {
				t.Fatal(err)
			}
			if out := mustRun(t, d.Client, "keeper", "cat /root/notes.txt /opt/pkg/marker"); out != "survives kill -9\ninstalled\n" {
				t.Fatalf("files after stop/start: %q", out)
			}
			// A stopped sandbox wakes on a dataplane request.
			if err := d.Client.StopSandbox(ctx, "keeper"); err != nil {
				t.Fatal(err)
			}
			d.kill9()
			d.restart()
			if out := mustRun(t, d.Client, "keeper", "cat /opt/pkg/marker"); out != "installed\n" {
				t.Fatalf("wake after restart: %q", out)
			}
		})
	}
}
