package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestAuditCmdTimeline checks `cubicle audit` prints one readable line per
// event (commands with their exit codes and durations) and `--step` the
// command's output with what was dropped.
func TestAuditCmdTimeline(t *testing.T) {
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv(envEndpoint, srv.URL)
	t.Setenv(envAPIKey, "k")
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	evs := []protocol.AuditEvent{
		{Seq: 1, Time: at, Actor: protocol.Actor{User: "bob", KeyPrefix: "cub_12"}, Kind: "lifecycle", Type: "created", Data: json.RawMessage(`{"snapshot_id":"sn1"}`)},
		{Seq: 2, Time: at, Actor: protocol.Actor{User: "bob"}, Kind: "command", Type: "command.started", Step: 2, Data: json.RawMessage(`{"command":"make test","env_keys":["TOKEN"]}`)},
		{Seq: 3, Time: at, Actor: protocol.Actor{User: "bob"}, Kind: "command", Type: "command.exited", Step: 2, Data: json.RawMessage(`{"exit_code":3,"duration_ms":1500,"stdout_bytes":10,"stderr_bytes":0}`)},
	}
	mux.HandleFunc("GET /v2/sandboxes/boxes/box/audit", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("kinds") != "command,lifecycle" {
			t.Errorf("kinds = %q", r.URL.Query().Get("kinds"))
		}
		json.NewEncoder(w).Encode(protocol.AuditList{Items: evs, NextSeq: 3})
	})
	mux.HandleFunc("GET /v2/sandboxes/boxes/box/audit/steps/2", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(protocol.AuditStep{Step: 2, Events: evs[1:], Stdout: &protocol.CommandOutput{Head: "head", Tail: "tail\n", TotalBytes: 20, Truncated: true}})
	})
	files := timelineLine(protocol.AuditEvent{Seq: 4, Time: at, Kind: "file", Type: "file.changed", Step: 2,
		Data: json.RawMessage(`{"added":[{"path":"/a"},{"path":"/b"}],"modified":[{"path":"/c"}],"deleted":["/d"],"added_count":2,"modified_count":1,"deleted_count":1}`)})
	pkg := timelineLine(protocol.AuditEvent{Seq: 5, Time: at, Kind: "package", Type: "package.upgraded", Step: 2,
		Data: json.RawMessage(`{"ecosystem":"npm","name":"left-pad","version":"1.3.0","previous_version":"1.0.0"}`)})
	if !strings.HasSuffix(files, "#2    files +2 ~1 -1  +/a +/b ~/c …") || !strings.HasSuffix(pkg, "#2    upgraded npm left-pad 1.3.0 (was 1.0.0)") {
		t.Fatalf("file and package lines:\n%s\n%s", files, pkg)
	}
	out, _, err := runCmd(newAuditCmd(), "", "box", "--kind", "command,lifecycle")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "bob/cub_12") || !strings.Contains(lines[0], "lifecycle created snapshot_id=sn1") ||
		!strings.Contains(lines[1], "#2") || !strings.Contains(lines[1], "$ make test   (env TOKEN)") ||
		!strings.Contains(lines[2], "→ exit 3 in 1.5s, stdout 10 B") {
		t.Fatalf("timeline:\n%s", out)
	}
	out, _, err = runCmd(newAuditCmd(), "", "box", "--step", "2")
	if err != nil || !strings.Contains(out, "--- stdout (20 bytes) ---\nhead\n[… 11 bytes not kept …]\ntail\n") {
		t.Fatalf("step (%v):\n%s", err, out)
	}
}

// TestColourKind: timeline lines are coloured by kind, and reset after.
func TestColourKind(t *testing.T) {
	if got := colourKind(protocol.KindFile, "x"); got != "\x1b[32mx\x1b[0m" {
		t.Fatalf("file line: %q", got)
	}
	if got := colourKind("unknown", "x"); got != "x" {
		t.Fatalf("unknown kind: %q", got)
	}
}
