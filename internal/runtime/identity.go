package runtime

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Identifier is implemented by drivers that can give a running sandbox
// another identity — UTS hostname (and /etc/hosts with it) and
// /etc/machine-id — without a restart: what a warm pool's pre-booted
// instance must take on when a record claims it. The manager keeps no
// warm pool on a driver without it or AgentIdentifier.
type Identifier interface {
	SetIdentity(ctx context.Context, id, hostname, machineID string) error
}

// AgentIdentifier is implemented by drivers whose agent can set the
// sandbox's identity itself (it holds CAP_SYS_ADMIN of the sandbox's own
// kernel, which commands lack): the manager asks the agent, one round
// trip on a connection it holds, instead of starting a process in the
// sandbox. It also gives memory-restored branches their own hostname.
type AgentIdentifier interface {
	AgentSetsIdentity() bool
}

// MachineIDPath is the sandbox's machine id (systemd's machine-id(5)).
const MachineIDPath = "/etc/machine-id"

// ApplyIdentity runs inside a sandbox as root with CAP_SYS_ADMIN, which
// commands lack (the agent has it where the driver gives it, see
// AgentIdentifier; elsewhere the driver starts `set-identity`): it sets
// the UTS hostname, regenerates /etc/hosts for it under WriteNetFiles'
// rules (keeping resolv.conf as it is) and, when machineID is not empty,
// writes it to /etc/machine-id.
func ApplyIdentity(ctx context.Context, hostname, machineID string) error {
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	resolv, err := os.ReadFile(ResolvPath)
	if err != nil {
		return fmt.Errorf("set identity: %w", err)
	}
	if err := WriteNetFiles(ctx, "/", hostname, resolv); err != nil {
		return err
	}
	if machineID == "" {
		return nil
	}
	if err := os.WriteFile(MachineIDPath, []byte(machineID+"\n"), 0o444); err != nil {
		return fmt.Errorf("set machine-id: %w", err)
	}
	return nil
}
