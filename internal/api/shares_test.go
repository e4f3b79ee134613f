package api

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// TestShareRoutes: under every prefix, for sandboxes and snapshots, the
// share routes pass kind, resource and request to the manager and encode
// the share; unknown members are 422s before the manager is called; the
// manager's refusals keep their status.
func TestShareRoutes(t *testing.T) {
	for _, p := range prefixes {
		for _, res := range []struct{ path, kind string }{{"/boxes/bobs", store.ShareSandbox}, {"/snapshots/bobs", store.ShareSnapshot}} {
			ta := newTestAPI(t, true)
			base := p + res.path + "/shares"
			st, body := ta.do(t, "POST", base, memberKey, map[string]any{"user_id": "cat", "access": "use"})
			if st != http.StatusCreated || field(body, "id") != "sh1" || field(body, "grantee") != "cat" || field(body, "access") != "use" ||
				field(body, "resource_kind") != res.kind || field(body, "created_at") != "2026-01-02T03:04:05Z" {
				t.Fatalf("POST %s: %d %v", base, st, body)
			}
			if ta.mgr.share.kind != res.kind || ta.mgr.share.ref != "bobs" || ta.mgr.share.req.UserID != "cat" {
				t.Fatalf("POST %s reached the manager as %+v", base, ta.mgr.share)
			}
			if st, _ := ta.do(t, "POST", base, memberKey, map[string]any{"workspace": true, "access": "read"}); st != 201 || !ta.mgr.share.req.Workspace {
				t.Fatalf("workspace share: %d %+v", st, ta.mgr.share.req)
			}
			st, body = ta.do(t, "GET", base, memberKey, nil)
			list, _ := field(body, "shares").([]any)
			if st != 200 || len(list) != 1 || field(list[0], "grantee") != "*" {
				t.Fatalf("GET %s: %d %v", base, st, body)
			}
			if st, _ := ta.do(t, "DELETE", base+"/sh9", memberKey, nil); st != http.StatusNoContent || ta.mgr.share.id != "sh9" || ta.mgr.share.kind != res.kind {
				t.Fatalf("DELETE %s/sh9: %d %+v", base, st, ta.mgr.share)
			}
		}
	}
	ta := newTestAPI(t, true)
	st, body := ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/shares", memberKey, `{"user":"cat","access":"use"}`)
	if loc, _ := validation(body); st != 422 || loc != "body/user" || ta.mgr.called("Share") {
		t.Fatalf("unknown member: %d %v", st, body)
	}
	for _, c := range []struct {
		err  error
		want int
	}{
		{errdefs.Field("access", "must be read or use"), 422},
		{fmt.Errorf("sandbox bobs: %w", errdefs.ErrNotFound), 404},
		{fmt.Errorf("managing the shares of sandbox bobs needs owner access: %w", errdefs.ErrForbidden), 403},
	} {
		ta.mgr.fail = c.err
		if st, body := ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/shares", memberKey, map[string]any{"user_id": "cat", "access": "x"}); st != c.want {
			t.Errorf("manager error %v: %d %v, want %d", c.err, st, body, c.want)
		}
	}
}

// TestDataplaneOps: each dataplane route asks the manager for its own
// operation's level (authz's table): downloads and searches read, exec and
// upload use.
func TestDataplaneOps(t *testing.T) {
	for _, c := range []struct {
		method, path, body string
		op                 authz.Op
	}{
		{"POST", "/dp/id-bobs/execute", `{"command":"ls"}`, authz.Exec},
		{"GET", "/dp/id-bobs/execute/ws", "", authz.Exec},
		{"POST", "/dp/id-bobs/upload?path=/a", "x", authz.UploadFile},
		{"GET", "/dp/id-bobs/download?path=/a", "", authz.DownloadFile},
		{"HEAD", "/dp/id-bobs/download?path=/a", "", authz.DownloadFile},
		{"POST", "/dp/id-bobs/glob", `{"pattern":"*","path":"/"}`, authz.SearchFiles},
		{"POST", "/dp/id-bobs/grep", `{"pattern":"x","path":"/"}`, authz.SearchFiles},
	} {
		ta := newTestAPI(t, true)
		st, body := ta.do(t, c.method, c.path, memberKey, c.body)
		if st != 404 || ta.mgr.dpOp != c.op {
			t.Errorf("%s %s: %d %v asked for %q, want %q (and the fake's 404)", c.method, c.path, st, body, ta.mgr.dpOp, c.op)
		}
	}
}
