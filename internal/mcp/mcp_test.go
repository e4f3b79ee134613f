package mcp

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// call calls tool with args and decodes its structured result into out;
// a tool error fails the test.
func call[T any](t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) T {
	t.Helper()
	var out T
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", tool, contentText(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: decode %s: %v", tool, b, err)
	}
	return out
}

// callErr calls tool and returns its tool error text ("" if it succeeded).
func callErr(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return err.Error()
	}
	if !res.IsError {
		return ""
	}
	return contentText(res)
}

func contentText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestTools: the server lists exactly the tools, each with a
// description and an object input schema whose every property is
// described for the model, and an output schema.
func TestTools(t *testing.T) {
	cs := newFakeAPI(t).session(t)
	want := []string{"audit", "capture_snapshot", "create_sandbox", "delete_sandbox", "diff_sandboxes", "fork_sandbox",
		"kill_command", "list_files", "list_sandboxes", "read_file", "read_output", "reset_sandbox", "run_command",
		"search_files", "send_input", "service_url", "start_command", "stop_sandbox", "write_file"}
	var got []string
	for tool, err := range cs.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, tool.Name)
		if len(tool.Description) < 30 {
			t.Errorf("%s: description %q is too thin for a model", tool.Name, tool.Description)
		}
		in, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		}
		if err := json.Unmarshal(in, &schema); err != nil || schema.Type != "object" {
			t.Errorf("%s: input schema %s", tool.Name, in)
		}
		for name, p := range schema.Properties {
			var prop struct {
				Description string `json:"description"`
			}
			if json.Unmarshal(p, &prop) != nil || prop.Description == "" {
				t.Errorf("%s.%s has no description", tool.Name, name)
			}
		}
		if tool.OutputSchema == nil {
			t.Errorf("%s has no output schema", tool.Name)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("tools %v\nwant %v", got, want)
	}
	// Required arguments are the ones without a default.
	for tool, err := range cs.Tools(t.Context(), nil) {
		if err == nil && tool.Name == "run_command" {
			b, _ := json.Marshal(tool.InputSchema)
			if !strings.Contains(string(b), `"required":["sandbox","command"]`) {
				t.Errorf("run_command schema %s: want sandbox and command required", b)
			}
		}
	}
}

// TestSandboxTools: create (limits and egress list translated to the
// API), list, fork, diff (bounded), delete, each through the MCP door.
func TestSandboxTools(t *testing.T) {
	f := newFakeAPI(t)
	cs := f.session(t)
	sb := call[SandboxInfo](t, cs, "create_sandbox", map[string]any{"name": "box", "memory_mib": 512, "egress_allow": []string{"pypi.org"}})
	if sb.Name != "box" || sb.Status != "ready" || sb.MemBytes != 512<<20 || sb.CreatedAt != "2026-01-02T03:04:05Z" {
		t.Errorf("create_sandbox = %+v", sb)
	}
	if pc := sb.Labels["proxy_config"]; pc != `{"access_control":{"allow_list":["pypi.org"]}}` {
		t.Errorf("proxy_config sent %q", pc)
	}
	call[SandboxInfo](t, cs, "create_sandbox", map[string]any{"name": "other"})
	l := call[SandboxList](t, cs, "list_sandboxes", map[string]any{"limit": 1})
	if len(l.Sandboxes) != 1 || l.Sandboxes[0].Name != "box" || l.NextOffset != 1 {
		t.Errorf("list_sandboxes page = %+v", l)
	}
	fk := call[ForkOutput](t, cs, "fork_sandbox", map[string]any{"sandbox": "box", "names": []string{"b1", "b2"}})
	if fk.SnapshotID != "fork-snap" || len(fk.Sandboxes) != 2 || fk.Sandboxes[1].Name != "b2" {
		t.Errorf("fork_sandbox = %+v", fk)
	}
	if e := callErr(t, cs, "fork_sandbox", map[string]any{"sandbox": "box", "count": 9}); !strings.Contains(e, "at most 8") {
		t.Errorf("fork of 9: %q", e)
	}
	d := call[DiffOutput](t, cs, "diff_sandboxes", map[string]any{"a": "box", "b": "b1", "limit": 2})
	if len(d.Changes) != 2 || d.Total != 5 || !d.Truncated {
		t.Errorf("diff_sandboxes = %+v", d)
	}
	if got := call[DoneOutput](t, cs, "delete_sandbox", map[string]any{"sandbox": "box"}); got.Status != "deleted" {
		t.Errorf("delete_sandbox = %+v", got)
	}
	if e := callErr(t, cs, "run_command", map[string]any{"sandbox": "box", "command": "echo hi"}); !strings.Contains(e, "404") {
		t.Errorf("run in a deleted sandbox: %q, want the API's 404", e)
	}
}

// TestLifecycleTools: capture, reset (to the capture), service_url and
// stop reach their API routes with the model's arguments.
func TestLifecycleTools(t *testing.T) {
	cs := newFakeAPI(t).session(t)
	sn := call[SnapshotInfo](t, cs, "capture_snapshot", map[string]any{"sandbox": "box", "name": "cp"})
	if sn.ID != "snap-cp" || sn.Status != "ready" {
		t.Errorf("capture_snapshot = %+v", sn)
	}
	if sb := call[SandboxInfo](t, cs, "reset_sandbox", map[string]any{"sandbox": "box", "snapshot": sn.ID}); sb.SnapshotID != "snap-cp" {
		t.Errorf("reset_sandbox = %+v", sb)
	}
	if u := call[ServiceURLOutput](t, cs, "service_url", map[string]any{"sandbox": "box", "port": 8080}); u.ServiceURL != "https://box--8080.svc" || u.Token != "tok" {
		t.Errorf("service_url = %+v", u)
	}
	if d := call[DoneOutput](t, cs, "stop_sandbox", map[string]any{"sandbox": "box"}); d.Status != "stopped" {
		t.Errorf("stop_sandbox = %+v", d)
	}
}

// TestAudit: without since_seq the newest events come back (here 245 to
// 250 of 250), each with its data as JSON; with it, the page after.
func TestAudit(t *testing.T) {
	f := newFakeAPI(t)
	cs := f.session(t)
	call[SandboxInfo](t, cs, "create_sandbox", map[string]any{"name": "box"})
	a := call[AuditOutput](t, cs, "audit", map[string]any{"sandbox": "box", "limit": 6})
	if len(a.Events) != 6 || a.Events[0].Seq != 245 || a.Events[5].Seq != 250 || a.NextSeq != 250 {
		t.Fatalf("audit tail = %+v", a)
	}
	if m, ok := a.Events[0].Data.(map[string]any); !ok || m["door"] != "mcp" {
		t.Errorf("event data %#v", a.Events[0].Data)
	}
	p := call[AuditOutput](t, cs, "audit", map[string]any{"sandbox": "box", "since_seq": 10, "limit": 3})
	if len(p.Events) != 3 || p.Events[0].Seq != 11 || p.NextSeq != 13 {
		t.Errorf("audit page = %+v", p)
	}
}

// TestRunCommandPages: a command's long output comes back in bounded
// pages that, read on with read_output, add up to exactly what it wrote.
func TestRunCommandPages(t *testing.T) {
	f := newFakeAPI(t)
	cs := f.session(t)
	call[SandboxInfo](t, cs, "create_sandbox", map[string]any{"name": "box"})
	out := call[CommandOutput](t, cs, "run_command", map[string]any{"sandbox": "box", "command": "yes 100000", "max_bytes": 30000})
	if out.Running || out.ExitCode == nil || *out.ExitCode != 0 || out.StdoutBytes != 100000 {
		t.Fatalf("run_command = running %v exit %v bytes %d", out.Running, out.ExitCode, out.StdoutBytes)
	}
	if len(out.Stdout) != 30000 || !out.StdoutTruncated || out.NextStdoutOffset != 30000 {
		t.Fatalf("first page: %d bytes, truncated %v, next %d", len(out.Stdout), out.StdoutTruncated, out.NextStdoutOffset)
	}
	all := out.Stdout
	for out.StdoutTruncated {
		out = call[CommandOutput](t, cs, "read_output", map[string]any{"command_id": out.CommandID, "stdout_offset": out.NextStdoutOffset, "max_bytes": 1 << 20})
		if len(out.Stdout) > maxPageBytes {
			t.Fatalf("a page of %d bytes, over the %d bound", len(out.Stdout), maxPageBytes)
		}
		all += out.Stdout
	}
	if all != strings.Repeat("y\n", 50000) {
		t.Errorf("paged output: %d bytes, want 100000 of y\\n", len(all))
	}
	code := call[CommandOutput](t, cs, "run_command", map[string]any{"sandbox": "box", "command": "exit 3"})
	if code.ExitCode == nil || *code.ExitCode != 3 {
		t.Errorf("exit 3 gave %+v", code)
	}
	slow := call[CommandOutput](t, cs, "run_command", map[string]any{"sandbox": "box", "command": "slow"})
	if slow.ExitCode != nil || !strings.Contains(slow.Error, "timed out") {
		t.Errorf("a timeout gave %+v", slow)
	}
}

// TestLongRunningCommand: start_command returns at once; send_input
// reaches the command's stdin, read_output waits for what it printed,
// closing stdin ends it; kill_command ends another.
func TestLongRunningCommand(t *testing.T) {
	f := newFakeAPI(t)
	cs := f.session(t)
	call[SandboxInfo](t, cs, "create_sandbox", map[string]any{"name": "box"})
	st := call[CommandOutput](t, cs, "start_command", map[string]any{"sandbox": "box", "command": "cat"})
	if !st.Running || st.CommandID == "" {
		t.Fatalf("start_command = %+v", st)
	}
	call[SendInputOutput](t, cs, "send_input", map[string]any{"command_id": st.CommandID, "input": "hello\n"})
	out := call[CommandOutput](t, cs, "read_output", map[string]any{"command_id": st.CommandID, "wait_seconds": 5})
	if out.Stdout != "hello\n" || !out.Running {
		t.Fatalf("read_output = %+v", out)
	}
	call[SendInputOutput](t, cs, "send_input", map[string]any{"command_id": st.CommandID, "input": "bye\n", "close_stdin": true})
	rest := ""
	for out.Running {
		out = call[CommandOutput](t, cs, "read_output", map[string]any{"command_id": st.CommandID, "stdout_offset": out.NextStdoutOffset, "wait_seconds": 5})
		rest += out.Stdout
	}
	if out.ExitCode == nil || *out.ExitCode != 0 || rest != "bye\n" {
		t.Errorf("after close_stdin: %q, %+v", rest, out)
	}
	if e := callErr(t, cs, "send_input", map[string]any{"command_id": st.CommandID, "input": "late"}); e == "" {
		t.Error("input to an ended command was accepted")
	}

	sl := call[CommandOutput](t, cs, "start_command", map[string]any{"sandbox": "box", "command": "sleep"})
	k := call[CommandOutput](t, cs, "kill_command", map[string]any{"command_id": sl.CommandID})
	if k.Running || k.ExitCode != nil && *k.ExitCode != 137 || !strings.Contains(k.Error, "killed") {
		t.Errorf("kill_command = %+v", k)
	}
	if e := callErr(t, cs, "read_output", map[string]any{"command_id": "nope"}); !strings.Contains(e, "no such command") {
		t.Errorf("unknown command id: %q", e)
	}
	if e := callErr(t, cs, "start_command", map[string]any{"sandbox": "missing", "command": "cat"}); !strings.Contains(e, "404") {
		t.Errorf("start in a missing sandbox: %q", e)
	}
}

// TestFileTools: write_file then read_file in pages (text and binary),
// list_files, and the cubicle://SANDBOX/PATH resource.
func TestFileTools(t *testing.T) {
	f := newFakeAPI(t)
	cs := f.session(t)
	call[SandboxInfo](t, cs, "create_sandbox", map[string]any{"name": "box"})
	content := strings.Repeat("héllo wörld\n", 10)
	w := call[WriteFileOutput](t, cs, "write_file", map[string]any{"sandbox": "box", "path": "/work/a.txt", "content": content})
	if w.BytesWritten != len(content) {
		t.Errorf("write_file = %+v", w)
	}
	var got string
	off := int64(0)
	for {
		r := call[ReadFileOutput](t, cs, "read_file", map[string]any{"sandbox": "box", "path": "/work/a.txt", "offset": off, "max_bytes": 7})
		if r.Encoding != "text" || r.SizeBytes != int64(len(content)) || len(r.Content) > 7 {
			t.Fatalf("read_file page at %d = %+v", off, r)
		}
		got += r.Content
		off = r.NextOffset
		if !r.Truncated {
			break
		}
	}
	if got != content {
		t.Errorf("paged read %q, want %q", got, content)
	}
	bin := []byte{0, 0xff, 0xfe, 1}
	call[WriteFileOutput](t, cs, "write_file", map[string]any{"sandbox": "box", "path": "/work/b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})
	r := call[ReadFileOutput](t, cs, "read_file", map[string]any{"sandbox": "box", "path": "/work/b.bin"})
	if r.Encoding != "base64" || r.Content != base64.StdEncoding.EncodeToString(bin) || r.Truncated {
		t.Errorf("binary read_file = %+v", r)
	}
	l := call[ListFilesOutput](t, cs, "list_files", map[string]any{"sandbox": "box", "pattern": "*.txt", "path": "/work"})
	if len(l.Files) != 1 || l.Files[0].Path != "/work/a.txt" || l.Files[0].SizeBytes != int64(len(content)) {
		t.Errorf("list_files = %+v", l)
	}
	res, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "cubicle://box/work/a.txt"})
	if err != nil || len(res.Contents) != 1 || res.Contents[0].Text != content {
		t.Errorf("resource read: %+v, %v", res, err)
	}
	if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "cubicle://box/work/none"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing resource: %v", err)
	}
	if e := callErr(t, cs, "read_file", map[string]any{"sandbox": "box", "path": "/work/none"}); !strings.Contains(e, "404") {
		t.Errorf("missing file: %q", e)
	}
}

// TestStreamPage: pages never split a UTF-8 character unless it is the
// last one, and bytes dropped past the retained window move the page's
// start forward.
func TestStreamPage(t *testing.T) {
	var s stream
	s.write([]byte("aé")) // a, 0xC3 0xA9
	if b, from, more := s.page(0, 2); string(b) != "a" || from != 0 || !more {
		t.Errorf("page cutting é: %q %d %v", b, from, more)
	}
	if b, _, more := s.page(1, 2); string(b) != "é" || more {
		t.Errorf("page of é: %q %v", b, more)
	}
	s.write(make([]byte, retainBytes))
	if s.start != 3 || s.total() != retainBytes+3 {
		t.Fatalf("start %d total %d", s.start, s.total())
	}
	if _, from, _ := s.page(0, 10); from != 3 {
		t.Errorf("a page of dropped bytes starts at %d, want 3", from)
	}
}
