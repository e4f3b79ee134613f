package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// OwnCapsEnv names, comma-separated, capabilities PID 1 holds for itself
// only: the agent drops them from the bounding set of every thread before
// it starts anything, so commands (root's execve gets the bounding set)
// never have them, while the agent keeps them effective. The gvisor
// driver gives the agent CAP_SYS_ADMIN this way, which setting the
// sandbox's hostname (POST /v1/identity) takes. Commands cannot take it
// from the agent: it is non-dumpable (see ReadToken) and they lack
// CAP_SYS_PTRACE.
const OwnCapsEnv = "CUBICLE_AGENT_OWN_CAPS"

// capNumbers are the capabilities OwnCapsEnv may name.
var capNumbers = map[string]uintptr{"CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN}

// keepOwnCaps drops the capabilities named by OwnCapsEnv's value from
// the bounding set of every thread of the process.
func keepOwnCaps(value string) error {
	if value == "" {
		return nil
	}
	for _, name := range strings.Split(value, ",") {
		c, ok := capNumbers[name]
		if !ok {
			return fmt.Errorf("agent: %s names %q, which is not one of the agent's own capabilities", OwnCapsEnv, name)
		}
		// A thread's bounding set is its own: all of them, so no later
		// fork (from whichever thread) passes the capability on.
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); e != 0 {
			return fmt.Errorf("agent: drop %s from the bounding set: %w", name, e)
		}
	}
	return nil
}

// IdentityRequest is the body of POST /v1/identity: the sandbox's UTS
// hostname (and /etc/hosts with it) and, when not empty, a new
// /etc/machine-id.
type IdentityRequest struct {
	Hostname  string `json:"hostname"`
	MachineID string `json:"machine_id,omitempty"`
}

var (
	hostnamePattern  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,62})$`)
	machineIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// handleIdentity gives the sandbox the hostname and machine-id the
// daemon binds to it: a claimed warm-pool instance, a restored branch.
// 403 NotPermitted when the agent lacks CAP_SYS_ADMIN (the runtime did
// not give it, see OwnCapsEnv): the daemon then uses the driver's way.
func (s *Server) handleIdentity(w http.ResponseWriter, r *http.Request) {
	var req IdentityRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequest", "identity: "+err.Error())
		return
	}
	if !hostnamePattern.MatchString(req.Hostname) || req.MachineID != "" && !machineIDPattern.MatchString(req.MachineID) {
		writeError(w, http.StatusBadRequest, "InvalidRequest", "hostname must be a DNS label of lowercase letters, digits and '-'; machine_id 32 lowercase hex digits")
		return
	}
	if err := runtime.ApplyIdentity(r.Context(), req.Hostname, req.MachineID); err != nil {
		if errors.Is(err, unix.EPERM) {
			writeError(w, http.StatusForbidden, "NotPermitted", err.Error())
			return
		}
		writeError(w, http.StatusInternalServerError, "IdentityFailed", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// SetIdentity gives the sandbox hostname and, when not empty, machineID
// (POST /v1/identity). An agent without the capability it takes answers
// 403 NotPermitted (callers check *HTTPError's Status).
func (c *Client) SetIdentity(ctx context.Context, hostname, machineID string) error {
	if err := c.postJSON(ctx, "/v1/identity", IdentityRequest{Hostname: hostname, MachineID: machineID}); err != nil {
		return fmt.Errorf("agent: set identity: %w", err)
	}
	return nil
}
