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

	// Network events (kind network), recorded by the daemon: an HTTP
	// request through the egress proxy (plain, or inside intercepted
	// TLS), a TLS connection it spliced by SNI, another TCP or UDP flow
	// (from conntrack), and a query to the daemon's resolver.
	EventNetworkHTTP = "network.http"
	EventNetworkTLS  = "network.tls"
	EventNetworkFlow = "network.flow"
	EventNetworkDNS  = "network.dns"
)

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
