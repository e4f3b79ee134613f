package protocol

import (
	"encoding/json"
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
	// deletions of files it does not hold are not seen.
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
