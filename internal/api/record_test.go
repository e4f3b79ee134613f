package api

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newRecordAPI is a test API with a real Recorder over SQLite, holding a
// record for bob's sandbox (created, one command with output, stopped),
// one for a deleted sandbox of w1 and one of another workspace.
func newRecordAPI(t testing.TB) (*testAPI, *record.Recorder) {
	t.Helper()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	rec := record.New(st, record.Options{})
	t.Cleanup(func() { rec.Close(); st.Close() })
	ta := &testAPI{mgr: newFakeSandboxes(), images: &fakeImages{}}
	ta.srv = New(ta.mgr, fakeAuth{}, ta.images, "http://api.test/", slog.New(slog.DiscardHandler), WithRecorder(rec))
	ctx := context.Background()
	lc := func(id, ws, typ string) {
		rec.Record(ctx, record.Event{SandboxID: id, WorkspaceID: ws, Kind: protocol.KindLifecycle, Type: typ})
	}
	lc("id-bobs", "w1", protocol.EventCreated)
	cmd := rec.StartCommand(ctx, record.CommandStart{SandboxID: "id-bobs", WorkspaceID: "w1", CommandID: "c", Command: "echo hi", Via: "http"})
	cmd.Output(record.Stdout, -1, []byte("hi\n"))
	code := 0
	cmd.Exited(ctx, &code, "")
	lc("id-bobs", "w1", protocol.EventStopped)
	lc("id-gone", "w1", protocol.EventDeleted)
	lc("id-other", "w2", protocol.EventCreated)
	return ta, rec
}

func auditTypes(t *testing.T, body any) (types []string, next float64) {
	t.Helper()
	items, _ := field(body, "items").([]any)
	for _, it := range items {
		types = append(types, it.(map[string]any)["type"].(string))
	}
	next, _ = field(body, "next_seq").(float64)
	return types, next
}

// TestAuditRead checks a record page, its filters and paging, the 422s
// naming bad parameters, and the step view with its output.
func TestAuditRead(t *testing.T) {
	ta, _ := newRecordAPI(t)
	const base = "/v2/sandboxes/boxes/bobs/audit"
	code, body := ta.do(t, "GET", base, memberKey, nil)
	if types, next := auditTypes(t, body); code != 200 || strings.Join(types, " ") != "created command.started command.exited stopped" || next != 4 {
		t.Fatalf("%d %v", code, body)
	}
	_, body = ta.do(t, "GET", base+"?since_seq=1&limit=1", memberKey, nil)
	if types, next := auditTypes(t, body); len(types) != 1 || types[0] != "command.started" || next != 2 {
		t.Fatalf("page: %v", body)
	}
	_, body = ta.do(t, "GET", base+"?kinds=command&step=2", memberKey, nil)
	if types, _ := auditTypes(t, body); strings.Join(types, " ") != "command.started command.exited" {
		t.Fatalf("filtered: %v", body)
	}
	for q, f := range map[string]string{"kinds=bogus": "kinds", "since_seq=-1": "since_seq", "limit=0": "limit", "step=x": "step", "follow=maybe": "follow"} {
		if code, body := ta.do(t, "GET", base+"?"+q, memberKey, nil); code != 422 {
			t.Fatalf("%s: %d %v", q, code, body)
		} else if loc, _ := validation(body); !strings.Contains(loc, f) {
			t.Fatalf("%s: 422 names %q, want %s", q, loc, f)
		}
	}
	code, body = ta.do(t, "GET", base+"/steps/2", memberKey, nil)
	stdout, _ := field(body, "stdout").(map[string]any)
	if code != 200 || stdout["head"] != "hi\n" || stdout["total_bytes"] != 3.0 || len(field(body, "events").([]any)) != 2 {
		t.Fatalf("step: %d %v", code, body)
	}
	if code, _ := ta.do(t, "GET", base+"/steps/9", memberKey, nil); code != 404 {
		t.Fatalf("missing step: %d", code)
	}
	// Someone who cannot see the sandbox cannot read its record.
	if code, _ := ta.do(t, "GET", "/v2/sandboxes/boxes/anns/audit", memberKey, nil); code != 404 {
		t.Fatalf("another user's sandbox: %d", code)
	}
}

// TestAuditNDJSON checks Accept: application/x-ndjson gets one event per line.
func TestAuditNDJSON(t *testing.T) {
	ta, _ := newRecordAPI(t)
	req := httptest.NewRequest("GET", "/v2/sandboxes/boxes/bobs/audit", nil)
	req.Header.Set("X-Api-Key", memberKey)
	req.Header.Set("Accept", "application/x-ndjson")
	w := httptest.NewRecorder()
	ta.srv.ServeHTTP(w, req)
	lines := strings.Split(strings.TrimSpace(w.Body.String()), "\n")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/x-ndjson" || len(lines) != 4 {
		t.Fatalf("%d %q %q", w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
	var e protocol.AuditEvent
	if err := json.Unmarshal([]byte(lines[3]), &e); err != nil || e.Seq != 4 || e.Type != protocol.EventStopped {
		t.Fatalf("last line %q: %v", lines[3], err)
	}
}

// TestAuditByID checks deleted sandboxes' records are readable by id by
// their workspace's admins only.
func TestAuditByID(t *testing.T) {
	ta, _ := newRecordAPI(t)
	code, body := ta.do(t, "GET", "/v2/sandboxes/audit/sandboxes/id-gone", adminKey, nil)
	if types, _ := auditTypes(t, body); code != 200 || len(types) != 1 || types[0] != "deleted" {
		t.Fatalf("admin: %d %v", code, body)
	}
	for _, c := range []struct{ key, id string }{{memberKey, "id-gone"}, {adminKey, "id-other"}, {adminKey, "id-never"}} {
		if code, _ := ta.do(t, "GET", "/v2/sandboxes/audit/sandboxes/"+c.id, c.key, nil); code != 404 {
			t.Fatalf("%s reading %s: %d, want 404", c.key, c.id, code)
		}
	}
	// An admin reads a live sandbox's steps by id too.
	if code, _ := ta.do(t, "GET", "/v2/sandboxes/audit/sandboxes/id-bobs/steps/2", adminKey, nil); code != 200 {
		t.Fatalf("admin, step by id: %d", code)
	}
}

// TestAuditFollow checks follow=true sends the stored events after
// since_seq, then new ones live, as server-sent events.
func TestAuditFollow(t *testing.T) {
	ta, rec := newRecordAPI(t)
	srv := httptest.NewServer(ta.srv)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v2/sandboxes/boxes/bobs/audit?follow=true&since_seq=3&kinds=lifecycle", nil)
	req.Header.Set("X-Api-Key", memberKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	next := func() protocol.AuditEvent {
		t.Helper()
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var e protocol.AuditEvent
				if err := json.Unmarshal([]byte(d), &e); err != nil {
					t.Fatal(err)
				}
				return e
			}
		}
		t.Fatalf("stream ended: %v", sc.Err())
		return protocol.AuditEvent{}
	}
	if e := next(); e.Seq != 4 || e.Type != protocol.EventStopped {
		t.Fatalf("caught up with %+v", e)
	}
	bg := context.Background()
	rec.StartCommand(bg, record.CommandStart{SandboxID: "id-bobs", WorkspaceID: "w1", CommandID: "d", Command: "true"}) // filtered out
	rec.Record(bg, record.Event{SandboxID: "id-bobs", WorkspaceID: "w1", Kind: protocol.KindLifecycle, Type: protocol.EventStarted})
	if e := next(); e.Seq != 6 || e.Type != protocol.EventStarted {
		t.Fatalf("live %+v", e)
	}
}
