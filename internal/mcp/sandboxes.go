package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// List bounds.
const (
	defaultListLimit = 50
	maxListLimit     = 200
	maxDiffChanges   = 1000
	maxAuditEvents   = 200
	// maxEventData is the most bytes of one audit event's data returned
	// as is; larger data is cut to a string of this size.
	maxEventData = 4 << 10
	// createTimeout bounds the wait for a new sandbox or fork to be ready.
	createTimeout = 120
	maxForks      = 8
)

// SandboxInput names one sandbox.
type SandboxInput struct {
	Sandbox string `json:"sandbox" jsonschema:"name of the sandbox"`
}

// CreateSandboxInput is create_sandbox's arguments.
type CreateSandboxInput struct {
	Snapshot       string            `json:"snapshot,omitempty" jsonschema:"snapshot to boot: an id, a name or name:tag (default: the server's default computer)"`
	Name           string            `json:"name,omitempty" jsonschema:"name for the sandbox, unique in the workspace (default: generated)"`
	CPUMillicores  int64             `json:"cpu_millicores,omitempty" jsonschema:"CPU limit in thousandths of a core (1000 = one core; default: the server's)"`
	MemoryMiB      int64             `json:"memory_mib,omitempty" jsonschema:"memory limit in MiB (default: the server's)"`
	DiskMiB        int64             `json:"disk_mib,omitempty" jsonschema:"filesystem capacity in MiB (default: the snapshot's)"`
	IdleTTLSeconds int64             `json:"idle_ttl_seconds,omitempty" jsonschema:"stop the sandbox after this many idle seconds (a multiple of 60; default: the server's)"`
	EgressAllow    []string          `json:"egress_allow,omitempty" jsonschema:"if set, the only hosts the sandbox may reach (domains, *.domain globs, IPs or CIDRs); everything else is blocked"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command in the sandbox"`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"key/value labels stored with the sandbox"`
}

// SandboxInfo is a sandbox as the tools report it.
type SandboxInfo struct {
	Name            string            `json:"name" jsonschema:"the sandbox's name, used by every other tool"`
	ID              string            `json:"id" jsonschema:"the sandbox's id"`
	Status          string            `json:"status" jsonschema:"provisioning, ready, stopped, failed or deleting"`
	StatusMessage   string            `json:"status_message,omitempty" jsonschema:"why it is in that status, when the server says"`
	SnapshotID      string            `json:"snapshot_id" jsonschema:"the snapshot it booted from"`
	CPUMillicores   int64             `json:"cpu_millicores" jsonschema:"CPU limit (1000 = one core)"`
	MemBytes        int64             `json:"mem_bytes" jsonschema:"memory limit in bytes"`
	FSCapacityBytes int64             `json:"fs_capacity_bytes" jsonschema:"filesystem capacity in bytes"`
	CreatedAt       string            `json:"created_at" jsonschema:"creation time (RFC 3339)"`
	Labels          map[string]string `json:"labels,omitempty" jsonschema:"its labels"`
}

func sandboxInfo(sb *protocol.Sandbox) SandboxInfo {
	return SandboxInfo{Name: sb.Name, ID: sb.ID, Status: sb.Status, StatusMessage: sb.StatusMessage, SnapshotID: sb.SnapshotID,
		CPUMillicores: sb.CPUMillicores, MemBytes: sb.MemBytes, FSCapacityBytes: sb.FSCapacityBytes,
		CreatedAt: sb.CreatedAt.UTC().Format(time.RFC3339), Labels: sb.Labels}
}

// ListSandboxesInput is list_sandboxes' arguments.
type ListSandboxesInput struct {
	NameContains string `json:"name_contains,omitempty" jsonschema:"only sandboxes whose name contains this"`
	Limit        int    `json:"limit,omitempty" jsonschema:"most sandboxes to return (default 50, at most 200)"`
	Offset       int    `json:"offset,omitempty" jsonschema:"sandboxes to skip, for the next page (next_offset of the previous one)"`
}

// SandboxList is list_sandboxes' result.
type SandboxList struct {
	Sandboxes  []SandboxInfo `json:"sandboxes" jsonschema:"the sandboxes this key can see, oldest first"`
	NextOffset int           `json:"next_offset,omitempty" jsonschema:"offset of the next page; absent on the last page"`
}

// CaptureInput is capture_snapshot's arguments.
type CaptureInput struct {
	Sandbox       string `json:"sandbox" jsonschema:"name of the sandbox to snapshot (it keeps running)"`
	Name          string `json:"name" jsonschema:"name of the new snapshot"`
	IncludeMemory bool   `json:"include_memory,omitempty" jsonschema:"also save memory, so sandboxes from the snapshot resume its running processes"`
}

// SnapshotInfo is a snapshot as the tools report it.
type SnapshotInfo struct {
	ID     string `json:"id" jsonschema:"the snapshot's id, for create_sandbox, reset_sandbox and diff_sandboxes"`
	Name   string `json:"name" jsonschema:"its name"`
	Status string `json:"status" jsonschema:"building, ready or failed"`
}

// ForkInput is fork_sandbox's arguments.
type ForkInput struct {
	Sandbox string   `json:"sandbox" jsonschema:"name of the sandbox to fork (it keeps running)"`
	Count   int      `json:"count,omitempty" jsonschema:"how many branches to boot (default 1, at most 8)"`
	Names   []string `json:"names,omitempty" jsonschema:"names of the branches (as many as count; default: generated)"`
}

// ForkOutput is fork_sandbox's result.
type ForkOutput struct {
	SnapshotID string        `json:"snapshot_id" jsonschema:"the snapshot captured from the sandbox, which every branch booted from"`
	Sandboxes  []SandboxInfo `json:"sandboxes" jsonschema:"the branches, each a copy of the sandbox's filesystem at the fork"`
}

// DiffInput is diff_sandboxes' arguments.
type DiffInput struct {
	A     string `json:"a" jsonschema:"a sandbox name or a snapshot id or name: the old side"`
	B     string `json:"b" jsonschema:"a sandbox name or a snapshot id or name: the new side"`
	Limit int    `json:"limit,omitempty" jsonschema:"most changes to return (default 200, at most 1000)"`
}

// DiffOutput is diff_sandboxes' result.
type DiffOutput struct {
	Changes   []protocol.DiffEntry `json:"changes" jsonschema:"paths that differ from a to b: kind is added, modified or deleted"`
	Total     int                  `json:"total" jsonschema:"how many paths differ in all"`
	Truncated bool                 `json:"truncated" jsonschema:"true when changes holds only the first limit of them"`
}

// ResetInput is reset_sandbox's arguments.
type ResetInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"name of the sandbox to reset"`
	Snapshot string `json:"snapshot,omitempty" jsonschema:"snapshot id to reset to (default: the one it booted from)"`
}

// ServiceURLInput is service_url's arguments.
type ServiceURLInput struct {
	Sandbox          string `json:"sandbox" jsonschema:"name of the sandbox"`
	Port             int    `json:"port" jsonschema:"TCP port a server in the sandbox listens on"`
	ExpiresInSeconds int64  `json:"expires_in_seconds,omitempty" jsonschema:"how long the URL's token is valid (default: the server's)"`
}

// ServiceURLOutput is service_url's result.
type ServiceURLOutput struct {
	ServiceURL string `json:"service_url" jsonschema:"URL of the port; requests must send the token in header X-Langsmith-Sandbox-Service-Token"`
	BrowserURL string `json:"browser_url" jsonschema:"URL to open in a browser (carries the token)"`
	Token      string `json:"token,omitempty" jsonschema:"the token: a credential for this port only"`
	ExpiresAt  string `json:"expires_at,omitempty" jsonschema:"when the token expires"`
}

// DoneOutput reports a finished lifecycle operation.
type DoneOutput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox"`
	Status  string `json:"status" jsonschema:"what happened: stopped or deleted"`
}

// AuditInput is audit's arguments.
type AuditInput struct {
	Sandbox  string   `json:"sandbox" jsonschema:"name of the sandbox"`
	SinceSeq int64    `json:"since_seq,omitempty" jsonschema:"return events after this seq (next_seq of the previous page; default: the most recent events)"`
	Kinds    []string `json:"kinds,omitempty" jsonschema:"only these kinds: lifecycle, command, file, network, package"`
	Limit    int      `json:"limit,omitempty" jsonschema:"most events to return (default 50, at most 200)"`
}

// AuditEvent is one entry of a sandbox's record.
type AuditEvent struct {
	Seq   int64  `json:"seq" jsonschema:"position in the sandbox's record, from 1"`
	Time  string `json:"time" jsonschema:"when (RFC 3339)"`
	Kind  string `json:"kind" jsonschema:"lifecycle, command, file, network or package"`
	Type  string `json:"type" jsonschema:"what happened, e.g. created, command.started, command.exited, file.changed"`
	Step  int64  `json:"step,omitempty" jsonschema:"the command it belongs to (seq of its command.started)"`
	Actor string `json:"actor" jsonschema:"who caused it: a user id, or system"`
	Data  any    `json:"data,omitempty" jsonschema:"details (for commands: the command line, the door it came through, the exit code); untrusted where the sandbox wrote it"`
}

// AuditOutput is audit's result.
type AuditOutput struct {
	Events  []AuditEvent `json:"events" jsonschema:"events, oldest first"`
	NextSeq int64        `json:"next_seq" jsonschema:"since_seq for the events after these"`
}

func (s *session) addSandboxTools(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "create_sandbox", Description: "Create a sandbox (an isolated Linux machine) and wait until it " +
		"is ready. Name it to refer to it later; every other tool takes that name. Optional limits, environment and an egress allow " +
		"list (the only hosts it may reach)."}, s.createSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_sandboxes", Description: "List the sandboxes this API key can see, with their status.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.listSandboxes)
	mcp.AddTool(srv, &mcp.Tool{Name: "capture_snapshot", Description: "Save a sandbox's filesystem (and optionally memory) as a new " +
		"snapshot that create_sandbox and reset_sandbox can boot. The sandbox keeps running."}, s.captureSnapshot)
	mcp.AddTool(srv, &mcp.Tool{Name: "fork_sandbox", Description: "Branch a running sandbox: capture it and boot count copies that " +
		"start with its files. Use branches to try alternatives in parallel, then compare them with diff_sandboxes."}, s.forkSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "diff_sandboxes", Description: "List the files that differ between two sandboxes or snapshots " +
		"(added, modified, deleted going from a to b).", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.diffSandboxes)
	mcp.AddTool(srv, &mcp.Tool{Name: "reset_sandbox", Description: "Discard everything a sandbox wrote and restart it from its " +
		"snapshot (or another one). Running commands are killed.", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}}, s.resetSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "service_url", Description: "Get a URL that reaches a TCP port a server in the sandbox listens " +
		"on, with a token that grants access to that port only."}, s.serviceURL)
	mcp.AddTool(srv, &mcp.Tool{Name: "stop_sandbox", Description: "Stop a sandbox, keeping its files (create_sandbox cannot restart " +
		"it; the API and CLI can). Running commands end.", Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}}, s.stopSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "delete_sandbox", Description: "Delete a sandbox and its files for good.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}}, s.deleteSandbox)
	mcp.AddTool(srv, &mcp.Tool{Name: "audit", Description: "Read a sandbox's audit record: its lifecycle, the commands run in it " +
		"(with the door each came through and exit codes), file transfers and changes, network calls.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.audit)
}

func (s *session) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in CreateSandboxInput) (*mcp.CallToolResult, SandboxInfo, error) {
	req := protocol.CreateSandboxRequest{Snapshot: in.Snapshot, Name: in.Name, Timeout: ptr(int64(createTimeout)),
		EnvVars: in.Env, Labels: in.Labels}
	if in.CPUMillicores > 0 {
		req.CPUMillicores = &in.CPUMillicores
	}
	if in.MemoryMiB > 0 {
		req.MemBytes = ptr(in.MemoryMiB << 20)
	}
	if in.DiskMiB > 0 {
		req.FSCapacityBytes = ptr(in.DiskMiB << 20)
	}
	if in.IdleTTLSeconds > 0 {
		req.IdleTTLSeconds = &in.IdleTTLSeconds
	}
	if len(in.EgressAllow) > 0 {
		pc, err := json.Marshal(protocol.ProxyConfig{AccessControl: &protocol.AccessControl{AllowList: in.EgressAllow}})
		if err != nil {
			return nil, SandboxInfo{}, fmt.Errorf("egress_allow: %w", err)
		}
		req.ProxyConfig = pc
	}
	sb, err := s.c.CreateSandbox(ctx, req)
	if err != nil {
		return nil, SandboxInfo{}, err
	}
	return nil, sandboxInfo(sb), nil
}

func (s *session) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in ListSandboxesInput) (*mcp.CallToolResult, SandboxList, error) {
	limit := listLimit(in.Limit, defaultListLimit, maxListLimit)
	// One more than asked says whether another page follows.
	l, err := s.c.ListSandboxes(ctx, cubicle.ListOptions{NameContains: in.NameContains, Limit: limit + 1, Offset: max(in.Offset, 0)})
	if err != nil {
		return nil, SandboxList{}, err
	}
	out := SandboxList{Sandboxes: []SandboxInfo{}}
	for i := range l.Sandboxes {
		if i == limit {
			out.NextOffset = max(in.Offset, 0) + limit
			break
		}
		out.Sandboxes = append(out.Sandboxes, sandboxInfo(&l.Sandboxes[i]))
	}
	return nil, out, nil
}

func (s *session) captureSnapshot(ctx context.Context, _ *mcp.CallToolRequest, in CaptureInput) (*mcp.CallToolResult, SnapshotInfo, error) {
	sn, err := s.c.CaptureSnapshot(ctx, in.Sandbox, protocol.CaptureSnapshotRequest{Name: in.Name, IncludeMemory: in.IncludeMemory})
	if err != nil {
		return nil, SnapshotInfo{}, err
	}
	return nil, SnapshotInfo{ID: sn.ID, Name: sn.Name, Status: sn.Status}, nil
}

func (s *session) forkSandbox(ctx context.Context, _ *mcp.CallToolRequest, in ForkInput) (*mcp.CallToolResult, ForkOutput, error) {
	count := in.Count
	if count <= 0 {
		count = max(len(in.Names), 1)
	}
	if count > maxForks {
		return nil, ForkOutput{}, fmt.Errorf("count: at most %d branches at once", maxForks)
	}
	r, err := s.c.Fork(ctx, in.Sandbox, protocol.ForkRequest{Count: count, Names: in.Names, Timeout: ptr(int64(createTimeout))})
	if err != nil {
		return nil, ForkOutput{}, err
	}
	out := ForkOutput{SnapshotID: r.SnapshotID, Sandboxes: []SandboxInfo{}}
	for i := range r.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sandboxInfo(&r.Sandboxes[i]))
	}
	return nil, out, nil
}

func (s *session) diffSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in DiffInput) (*mcp.CallToolResult, DiffOutput, error) {
	d, err := s.c.Diff(ctx, in.A, in.B)
	if err != nil {
		return nil, DiffOutput{}, err
	}
	limit := listLimit(in.Limit, 200, maxDiffChanges)
	out := DiffOutput{Changes: d.Changes, Total: len(d.Changes)}
	if out.Changes == nil {
		out.Changes = []protocol.DiffEntry{}
	}
	if len(out.Changes) > limit {
		out.Changes, out.Truncated = out.Changes[:limit], true
	}
	return nil, out, nil
}

func (s *session) resetSandbox(ctx context.Context, _ *mcp.CallToolRequest, in ResetInput) (*mcp.CallToolResult, SandboxInfo, error) {
	sb, err := s.c.ResetSandbox(ctx, in.Sandbox, in.Snapshot)
	if err != nil {
		return nil, SandboxInfo{}, err
	}
	return nil, sandboxInfo(sb), nil
}

func (s *session) serviceURL(ctx context.Context, _ *mcp.CallToolRequest, in ServiceURLInput) (*mcp.CallToolResult, ServiceURLOutput, error) {
	req := protocol.ServiceURLRequest{Port: in.Port}
	if in.ExpiresInSeconds > 0 {
		req.ExpiresInSeconds = &in.ExpiresInSeconds
	}
	r, err := s.c.ServiceURL(ctx, in.Sandbox, req)
	if err != nil {
		return nil, ServiceURLOutput{}, fmt.Errorf("service URL of %s port %d: %w", in.Sandbox, in.Port, err)
	}
	return nil, ServiceURLOutput{ServiceURL: r.ServiceURL, BrowserURL: r.BrowserURL, Token: r.Token, ExpiresAt: r.ExpiresAt}, nil
}

func (s *session) stopSandbox(ctx context.Context, _ *mcp.CallToolRequest, in SandboxInput) (*mcp.CallToolResult, DoneOutput, error) {
	if err := s.c.StopSandbox(ctx, in.Sandbox); err != nil {
		return nil, DoneOutput{}, err
	}
	return nil, DoneOutput{Sandbox: in.Sandbox, Status: protocol.StatusStopped}, nil
}

func (s *session) deleteSandbox(ctx context.Context, _ *mcp.CallToolRequest, in SandboxInput) (*mcp.CallToolResult, DoneOutput, error) {
	if err := s.c.DeleteSandbox(ctx, in.Sandbox); err != nil {
		return nil, DoneOutput{}, err
	}
	return nil, DoneOutput{Sandbox: in.Sandbox, Status: "deleted"}, nil
}

func (s *session) audit(ctx context.Context, _ *mcp.CallToolRequest, in AuditInput) (*mcp.CallToolResult, AuditOutput, error) {
	limit := listLimit(in.Limit, defaultListLimit, maxAuditEvents)
	var items []protocol.AuditEvent
	var next int64
	if in.SinceSeq > 0 {
		l, err := s.c.Audit(ctx, in.Sandbox, cubicle.AuditOptions{SinceSeq: in.SinceSeq, Kinds: in.Kinds, Limit: limit})
		if err != nil {
			return nil, AuditOutput{}, err
		}
		items, next = l.Items, l.NextSeq
	} else {
		var err error
		if items, next, err = s.auditTail(ctx, in.Sandbox, in.Kinds, limit); err != nil {
			return nil, AuditOutput{}, err
		}
	}
	out := AuditOutput{Events: []AuditEvent{}, NextSeq: next}
	for _, e := range items {
		out.Events = append(out.Events, auditEvent(e))
	}
	return nil, out, nil
}

// auditTail is the sandbox's newest n events (of kinds) and the seq after
// them, paging through the record at the server's largest page.
func (s *session) auditTail(ctx context.Context, sandbox string, kinds []string, n int) ([]protocol.AuditEvent, int64, error) {
	var tail []protocol.AuditEvent
	var seq int64
	for {
		l, err := s.c.Audit(ctx, sandbox, cubicle.AuditOptions{SinceSeq: seq, Kinds: kinds, Limit: 1000})
		if err != nil {
			return nil, 0, err
		}
		tail = append(tail, l.Items...)
		if len(tail) > n {
			tail = append(tail[:0:0], tail[len(tail)-n:]...)
		}
		if len(l.Items) == 0 || l.NextSeq <= seq {
			return tail, seq, nil
		}
		seq = l.NextSeq
	}
}

func auditEvent(e protocol.AuditEvent) AuditEvent {
	out := AuditEvent{Seq: e.Seq, Time: e.Time.UTC().Format(time.RFC3339Nano), Kind: e.Kind, Type: e.Type, Step: e.Step, Actor: e.Actor.User}
	switch {
	case len(e.Data) == 0:
	case len(e.Data) > maxEventData:
		out.Data = text(e.Data[:maxEventData]) + "…(cut)"
	default:
		var v any
		if json.Unmarshal(e.Data, &v) == nil {
			out.Data = v
		}
	}
	return out
}

// listLimit is a requested list size within its bounds.
func listLimit(n, def, most int) int {
	if n <= 0 {
		return def
	}
	return min(n, most)
}
