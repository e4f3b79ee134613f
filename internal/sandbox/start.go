package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Start commands.
//
// A snapshot may carry a start command (a Dockerfile's ENTRYPOINT/CMD, or
// an explicit start_cmd) and a readiness probe (ready_cmd). Every cold
// boot of a sandbox from it starts the command in the background, after
// the agent answers and before the sandbox is ready; with a probe, the
// sandbox turns ready only once the probe exits 0, and a probe that never
// passes within the boot timeout fails the boot. A memory restore skips
// both: the process is already running.

const (
	// startLog is where a start command's output goes inside the sandbox.
	startLog = "/tmp/cubicle-start.log"
	// probeInterval is the pause between two readiness probes.
	probeInterval = 100 * time.Millisecond
	// probeTimeout bounds one run of the probe.
	probeTimeout int64 = 10
)

// runStart starts sn's start command in instance inst of sb and waits
// for its probe; nothing to do is not an error.
func (m *Manager) runStart(ctx context.Context, sb *store.Sandbox, sn *store.Snapshot, c *agent.Client) error {
	if sn.StartCmd == "" && sn.ReadyCmd == "" {
		return nil
	}
	rc := effectiveRunConfig(sn, sb)
	if sn.StartCmd != "" {
		// Detached from the exec session (no pipes held, own session), so
		// the command outlives it.
		bg := fmt.Sprintf("S=; command -v setsid >/dev/null 2>&1 && S=setsid; $S /bin/sh -c %s > %s 2>&1 < /dev/null &",
			shellQuote(sn.StartCmd), startLog)
		var out strings.Builder
		code, err := c.Exec(ctx, protocol.ExecFrame{Command: bg, Shell: "/bin/sh", RunConfig: &rc, CloseStdin: true}, &out, &out)
		if err != nil {
			return fmt.Errorf("start command: %w", err)
		}
		if code != 0 {
			return fmt.Errorf("start command could not be started (exit %d): %s", code, strings.TrimSpace(out.String()))
		}
	}
	if sn.ReadyCmd == "" {
		return nil
	}
	secs := probeTimeout
	for {
		var out strings.Builder
		code, err := c.Exec(ctx, protocol.ExecFrame{Command: sn.ReadyCmd, Shell: "/bin/sh", RunConfig: &rc, CloseStdin: true, TimeoutSeconds: &secs}, &out, &out)
		if err == nil && code == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ready_cmd %q did not pass before the boot timed out (last exit %d: %s; the start command's output is in %s)",
				sn.ReadyCmd, code, tail(out.String(), 512), startLog)
		case <-time.After(probeInterval):
		}
	}
}

// shellQuote quotes s as one /bin/sh word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
