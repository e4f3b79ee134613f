package protocol

import (
	"encoding/json"
	"reflect"
	"time"
)

// Audit event kinds: the families of a sandbox's record.
const (
	KindLifecycle = "lifecycle"
	KindCommand   = "command"
	KindFile      = "file"
	KindNetwork   = "network"
	KindPackage   = "package"
)

// Audit event types. Lifecycle types are bare verbs; command types carry
// their kind as a prefix.
const (
	EventCreated       = "created"
	EventStarted       = "started"
	EventStopped       = "stopped"
	EventWoken         = "woken"
	EventCaptured      = "captured"
	EventForked        = "forked"
	EventReset         = "reset"
	EventRenamed       = "renamed"
	EventDeleted       = "deleted"
	EventPolicyChanged = "policy_changed"
	// EventBootFailed is a boot (first or restart) that did not finish:
	// the sandbox is failed, or stays stopped.
	EventBootFailed = "boot_failed"

	EventCommandStarted     = "command.started"
	EventCommandExited      = "command.exited"
	EventCommandKilled      = "command.killed"
	EventCommandReconnected = "command.reconnected"

	// File API transfers (step 0).
	EventFileUploaded   = "file.uploaded"
	EventFileDownloaded = "file.downloaded"
	// EventFileChanged lists what a command changed in the sandbox's
	// filesystem (FileChanges), computed by the daemon after it ended; at
	// stop and capture (step 0) what changed since the last command.
	EventFileChanged = "file.changed"

	// Packages a step installed, removed or upgraded (PackageChange),
	// derived from its file.changed event.
	EventPackageInstalled = "package.installed"
	EventPackageRemoved   = "package.removed"
	EventPackageUpgraded  = "package.upgraded"

	// Network events (kind network), recorded by the daemon: an HTTP
	// request through the egress proxy (plain, or inside intercepted
	// TLS), a TLS connection it spliced by SNI, another TCP or UDP flow
	// (from conntrack), and a query to the daemon's resolver.
	EventNetworkHTTP = "network.http"
	EventNetworkTLS  = "network.tls"
	EventNetworkFlow = "network.flow"
	EventNetworkDNS  = "network.dns"
)

// FileChanges is a file.changed event's data. The lists hold at most a
// capped number of paths in all (Truncated then marks that some were left
// out); the counts are always complete.
type FileChanges struct {
	Added    []AddedFile    `json:"added,omitempty"`
	Modified []ModifiedFile `json:"modified,omitempty"`
	Deleted  []string       `json:"deleted,omitempty"`
	// AddedCount, ModifiedCount and DeletedCount count every change.
	AddedCount    int  `json:"added_count"`
	ModifiedCount int  `json:"modified_count"`
	DeletedCount  int  `json:"deleted_count"`
	Truncated     bool `json:"truncated,omitempty"`
	// Incomplete: the daemon's index of this sandbox's files is full, so
	// deletions of files it does not hold are not seen; or (with no paths
	// or counts) the step changed too much to list (more than 4 MiB of
	// paths), and only that it did is recorded.
	Incomplete bool `json:"incomplete,omitempty"`
	// At is the lifecycle event that caused a step-0 scan (stopped,
	// captured); empty after a command.
	At string `json:"at,omitempty"`
}

// AddedFile is a path a step created. Mode is in ls -l form
// ("-rw-r--r--", "drwxr-xr-x").
type AddedFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Mode string `json:"mode"`
}

// ModifiedFile is a path a step changed; SizeBefore and ModeBefore are
// set when they differ from now.
type ModifiedFile struct {
	Path       string `json:"path"`
	SizeBefore *int64 `json:"size_before,omitempty"`
	Size       int64  `json:"size"`
	ModeBefore string `json:"mode_before,omitempty"`
	Mode       string `json:"mode"`
}

// Package ecosystems.
const (
	EcosystemDpkg = "dpkg"
	EcosystemPip  = "pip"
	EcosystemNpm  = "npm"
)

// PackageChange is a package event's data. PreviousVersion is set for an
// upgrade (the version before; for a removal, Version is the one removed).
// Path is where npm and pip keep it (its node_modules or dist-info dir).
type PackageChange struct {
	Ecosystem       string `json:"ecosystem"`
	Name            string `json:"name"`
	Version         string `json:"version"`
	PreviousVersion string `json:"previous_version,omitempty"`
	Path            string `json:"path,omitempty"`
}

// Stop reasons carried by a stopped event's data.reason.
const (
	StopAPI   = "api"
	StopIdle  = "idle"
	StopOOM   = "oom"
	StopCrash = "crash"
)

// ActorSystem is the actor of events no API caller caused (the reaper, a
// sandbox dying).
const ActorSystem = "system"

// Actor is who caused an event: an API key's user and the key's public
// prefix, or User "system".
type Actor struct {
	User      string `json:"user"`
	KeyPrefix string `json:"key_prefix,omitempty"`
}

// AuditEvent is one entry of a sandbox's record (GET …/boxes/{name}/audit).
// Seq increases by one per event of a sandbox, from 1; Step ties command
// events (and later file, network and package events) to the command they
// belong to: the seq of its command.started event, 0 for none.
type AuditEvent struct {
	Seq         int64           `json:"seq"`
	Time        time.Time       `json:"time"`
	SandboxID   string          `json:"sandbox_id"`
	WorkspaceID string          `json:"workspace_id"`
	Actor       Actor           `json:"actor"`
	Kind        string          `json:"kind"`
	Type        string          `json:"type"`
	Step        int64           `json:"step,omitempty"`
	Data        json.RawMessage `json:"data,omitempty"`
}

// AuditList is a page of a sandbox's record. NextSeq is the since_seq that
// continues after it (the last item's seq, or the request's since_seq when
// the page is empty).
type AuditList struct {
	Items   []AuditEvent `json:"items"`
	NextSeq int64        `json:"next_seq"`
}

// CommandOutput is one stream of a command's captured output: Head (and,
// once the stream outgrew the capture cap, Tail) with the total bytes the
// command wrote; Truncated marks that the middle was dropped.
type CommandOutput struct {
	Head       string `json:"head"`
	Tail       string `json:"tail,omitempty"`
	TotalBytes int64  `json:"total_bytes"`
	Truncated  bool   `json:"truncated"`
}

// AuditStep is one command with its events and output
// (GET …/boxes/{name}/audit/steps/{step}).
type AuditStep struct {
	Step   int64          `json:"step"`
	Events []AuditEvent   `json:"events"`
	Stdout *CommandOutput `json:"stdout,omitempty"`
	Stderr *CommandOutput `json:"stderr,omitempty"`
}

// HistoryStep is one command of a sandbox's history: its lineage
// included, so a fork branch's history begins with its parent's commands
// up to the fork. SandboxID and Step locate it in the record that holds
// it (an ancestor's, for inherited steps).
type HistoryStep struct {
	SandboxID      string `json:"sandbox_id"`
	Step           int64  `json:"step"`
	Command        string `json:"command"`
	Shell          string `json:"shell,omitempty"`
	User           string `json:"user,omitempty"`
	Cwd            string `json:"cwd,omitempty"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty"`
	ExitCode       *int   `json:"exit_code"`
	// Error is how a command without an exit code ended (CommandTimeout,
	// a kill, lost).
	Error string `json:"error,omitempty"`
	// Files are the data of the step's file events.
	Files []json.RawMessage `json:"files,omitempty"`
}

// AuditDiff compares two sandboxes' histories (GET …/audit/diff?a=&b=):
// the steps they share (same command, shell, user, cwd and outcome, in
// the same order), then where each went its own way.
type AuditDiff struct {
	A      string        `json:"a"`
	B      string        `json:"b"`
	Common []HistoryStep `json:"common"`
	OnlyA  []HistoryStep `json:"only_a"`
	OnlyB  []HistoryStep `json:"only_b"`
}

// ReplayRequest is POST …/boxes/{name}/replay: re-run the sandbox's
// recorded commands in a new sandbox. Steps are step ids of the sandbox's
// own record; none (or Steps "all") replays its whole history, lineage
// included. FromSnapshot (id or name) defaults to the snapshot the
// history starts from.
type ReplayRequest struct {
	FromSnapshot string      `json:"from_snapshot,omitempty"`
	Steps        ReplaySteps `json:"steps,omitempty"`
	Name         string      `json:"name,omitempty"`
}

// ReplaySteps is a list of step ids, or all of them (JSON "all", or
// absent).
type ReplaySteps struct {
	All bool
	IDs []int64
}

// UnmarshalJSON accepts "all" or an array of step ids.
func (s *ReplaySteps) UnmarshalJSON(b []byte) error {
	var all string
	if json.Unmarshal(b, &all) == nil {
		if all != "all" {
			return &json.UnmarshalTypeError{Value: "string " + all, Type: reflect.TypeOf(s)}
		}
		*s = ReplaySteps{All: true}
		return nil
	}
	var ids []int64
	if err := json.Unmarshal(b, &ids); err != nil {
		return err
	}
	*s = ReplaySteps{IDs: ids, All: len(ids) == 0}
	return nil
}

// MarshalJSON writes "all" or the ids.
func (s ReplaySteps) MarshalJSON() ([]byte, error) {
	if s.All || len(s.IDs) == 0 {
		return []byte(`"all"`), nil
	}
	return json.Marshal(s.IDs)
}

// ReplayStepResult is how one replayed command compared with the
// original.
type ReplayStepResult struct {
	Source      HistoryStep `json:"source"`
	Step        int64       `json:"step"`
	ExitCode    *int        `json:"exit_code"`
	Error       string      `json:"error,omitempty"`
	ExitMatched bool        `json:"exit_matched"`
	// OutputMatched compares stdout and stderr as the record keeps them:
	// total bytes, head and tail.
	OutputMatched bool `json:"output_matched"`
}

// ReplayResult is the answer of a replay: the new sandbox (with a fresh
// record of its own) and each step's comparison.
type ReplayResult struct {
	Sandbox *Sandbox           `json:"sandbox"`
	Steps   []ReplayStepResult `json:"steps"`
	Matched bool               `json:"matched"`
}

// SandboxRef names a sandbox in an event's data (a fork's parent or
// children).
type SandboxRef struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}
