package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestAuditAgentSession drives a whole agent session with the official npm
// client (testdata/agent-session.mjs) and checks the sandbox's audit
// record holds exactly its commands with their exit codes (the failure,
// the timeout kill, the PTY command), the files each changed, the
// packages it "installed", its network calls (the intercepted HTTPS call
// with the injected rule's name, the raw TCP flow) and its output — and
// that neither the injected secret nor any API key is anywhere in it.
func TestAuditAgentSession(t *testing.T) {
	e := newEgressEnvArgs(t, "namespace", nil)
	c := e.d.Client
	ctx := context.Background()
	const secret = "sk-agent-session-7d41e9"
	if code, b := e.api(t, "PUT", "/secrets/SESSION_TOKEN", map[string]string{"value": "Bearer " + secret}); code != 200 {
		t.Fatalf("put secret: %d %s", code, b)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, e.in.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := npmDirVersion(t, "0.12", true)
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "test", "e2e", "testdata", "agent-session.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "agent-session.mjs")
	if err := os.WriteFile(dst, script, 0o644); err != nil {
		t.Fatal(err)
	}
	pc := `{"rules":[{"name":"session-token","match_hosts":["secure.test"],"headers":[
		{"name":"Authorization","type":"workspace_secret","value":"{SESSION_TOKEN}"}]}]}`
	nctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(nctx, "node", dst)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LANGSMITH_ENDPOINT="+e.d.Endpoint, "LANGSMITH_API_KEY="+testKey,
		"SESSION_SNAPSHOT="+e.snap, "SESSION_NAME=agent", "SESSION_PROXY="+pc, "SESSION_TOOL="+egClient(t),
		"SESSION_CA="+caFile, "SESSION_WEB="+e.in.addr(0), "SESSION_RAW="+e.in.addr(0))
	outb, err := cmd.CombinedOutput()
	t.Logf("session:\n%s", outb)
	if err != nil || !strings.Contains(string(outb), "SESSION PASSED") {
		t.Fatalf("the session failed: %v", err)
	}
	for _, want := range []string{"https exit=0", "tcp exit=0", "fail exit=3", "pty exit=0"} {
		if !strings.Contains(string(outb), want) {
			t.Errorf("session output lacks %q", want)
		}
	}

	// Wait for the record to settle (file scans and network events come
	// just after each command's exit).
	var all []protocol.AuditEvent
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		l, err := c.Audit(ctx, "agent", cubicle.AuditOptions{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		all = l.Items
		if hasEvent(all, func(ev protocol.AuditEvent) bool { return ev.Type == protocol.EventNetworkFlow }) || time.Now().After(deadline) {
			break
		}
	}
	steps := map[string]int64{} // command → step
	exits := map[int64]string{}
	for _, ev := range all {
		var d struct {
			Command  string `json:"command"`
			ExitCode *int   `json:"exit_code"`
			Error    string `json:"error"`
			PTY      bool   `json:"pty"`
		}
		json.Unmarshal(ev.Data, &d)
		switch ev.Type {
		case protocol.EventCommandStarted:
			steps[d.Command] = ev.Seq
		case protocol.EventCommandExited:
			if d.ExitCode != nil {
				exits[ev.Step] = "exit " + strings.TrimSpace(string(mustJSON(*d.ExitCode)))
			} else {
				exits[ev.Step] = d.Error
			}
		}
	}
	stepOfCmd := func(prefix string) int64 {
		t.Helper()
		for c, s := range steps {
			if strings.HasPrefix(c, prefix) {
				return s
			}
		}
		t.Fatalf("no command %q in the record (have %v)", prefix, steps)
		return 0
	}
	if len(steps) != 8 {
		t.Errorf("%d commands recorded, want the session's 8: %v", len(steps), steps)
	}
	for prefix, want := range map[string]string{"chmod": "exit 0", "echo second line": "exit 0", "mkdir -p /var/lib/dpkg": "exit 0",
		"egclient": "exit 0", "nc -w 3": "exit 0", "echo about to fail": "exit 3", "sleep 30": protocol.ErrCommandTimeout, "tty": "exit 0"} {
		if got := exits[stepOfCmd(prefix)]; got != want {
			t.Errorf("%q ended %q, want %q", prefix, got, want)
		}
	}
	if st, err := c.AuditStep(ctx, "agent", stepOfCmd("echo about to fail")); err != nil || st.Stderr == nil || st.Stderr.Head != "about to fail\n" {
		t.Errorf("the failing command's recorded stderr: %+v %v", st, err)
	}
	if !hasEvent(all, func(ev protocol.AuditEvent) bool {
		return ev.Type == protocol.EventCommandKilled && ev.Step == stepOfCmd("sleep 30")
	}) {
		t.Error("no kill event for the timed-out command")
	}
	edit := stepOfCmd("echo second line")
	for _, path := range []string{"/work/notes.txt", "/work/scratch.txt", "/work/out/result"} {
		if !hasEvent(all, func(ev protocol.AuditEvent) bool {
			return ev.Type == protocol.EventFileChanged && ev.Step == edit && strings.Contains(string(ev.Data), `"`+path+`"`)
		}) {
			var fe []string
			for _, ev := range all {
				if ev.Kind == protocol.KindFile {
					fe = append(fe, fmt.Sprintf("step %d %s %s", ev.Step, ev.Type, ev.Data))
				}
			}
			t.Errorf("the edit step (%d)'s file events do not name %s; file events:\n%s", edit, path, strings.Join(fe, "\n"))
		}
	}
	if !hasEvent(all, func(ev protocol.AuditEvent) bool {
		return ev.Type == protocol.EventFileUploaded && strings.Contains(string(ev.Data), "/work/notes.txt")
	}) {
		t.Error("the client's file write is not a file.uploaded event")
	}
	install := stepOfCmd("mkdir -p /var/lib/dpkg")
	for _, pkg := range []string{`"name":"demo-tool"`, `"name":"demo_pkg"`} {
		if !hasEvent(all, func(ev protocol.AuditEvent) bool {
			return ev.Type == protocol.EventPackageInstalled && ev.Step == install && strings.Contains(string(ev.Data), pkg)
		}) {
			t.Errorf("no package.installed %s in the install step", pkg)
		}
	}
	https := stepOfCmd("egclient")
	if !hasEvent(all, func(ev protocol.AuditEvent) bool {
		return ev.Type == protocol.EventNetworkHTTP && ev.Step == https && strings.Contains(string(ev.Data), "session-token") &&
			strings.Contains(string(ev.Data), "secure.test")
	}) {
		t.Error("no network.http event naming the injected rule for the HTTPS call")
	}
	if !hasEvent(all, func(ev protocol.AuditEvent) bool {
		return ev.Type == protocol.EventNetworkFlow && strings.Contains(string(ev.Data), `"port":7000`)
	}) {
		t.Error("no network.flow event for the raw TCP connection")
	}
	// Another workspace's admin cannot read the record, by name or id.
	intruder := addKey(t, e.d, "w2", "w2-admin", store.RoleAdmin)
	for _, path := range []string{"/v2/sandboxes/boxes/agent/audit", "/v2/sandboxes/audit/sandboxes/" + all[0].SandboxID} {
		if code, b := raw(t, e.d, intruder, "GET", path, nil); code != 404 {
			t.Errorf("another workspace reads %s: %d %s", path, code, b)
		}
	}
	whole, _ := json.Marshal(all)
	for _, s := range []string{secret, testKey} {
		if strings.Contains(string(whole), s) {
			t.Errorf("the audit record contains %q", s)
		}
	}
	for _, s := range steps {
		st, err := c.AuditStep(ctx, "agent", s)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(st)
		if strings.Contains(string(b), secret) {
			t.Errorf("step %d's record contains the secret", s)
		}
	}
}

func hasEvent(evs []protocol.AuditEvent, match func(protocol.AuditEvent) bool) bool {
	for _, ev := range evs {
		if match(ev) {
			return true
		}
	}
	return false
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }
