package api

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBuildSnapshotRequestShapes checks both build bodies reach the
// manager with every field, that a JSON body is still the protocol's
// create, and that bad fields are 422s naming them.
func TestBuildSnapshotRequestShapes(t *testing.T) {
	ta := newTestAPI(t, false)
	post := func(ct, query string, body *bytes.Buffer) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v2/sandboxes/snapshots"+query, body)
		req.Header.Set("X-Api-Key", memberKey)
		req.Header.Set("Content-Type", ct)
		rec := httptest.NewRecorder()
		ta.srv.ServeHTTP(rec, req)
		return rec
	}
	rec := post("application/x-tar", "?name=app&target=final&no_cache=true&build_arg=A=1&build_arg=B=x%3Dy&dockerfile=FROM+busybox", bytes.NewBufferString("TAR"))
	b := ta.mgr.build
	if rec.Code != http.StatusCreated || b.Name != "app" || b.Target != "final" || !b.NoCache || b.Dockerfile != "FROM busybox" ||
		b.BuildArgs["A"] != "1" || b.BuildArgs["B"] != "x=y" || ta.mgr.buildContext != "TAR" {
		t.Fatalf("tar build: %d %s; request %+v context %q", rec.Code, rec.Body, b, ta.mgr.buildContext)
	}

	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	mw.WriteField("name", "app2")
	mw.WriteField("dockerfile", "FROM busybox\nRUN true\n")
	mw.WriteField("build_arg", "K=V")
	fw, _ := mw.CreateFormFile("context", "context.tar")
	fw.Write([]byte("CTX"))
	mw.Close()
	rec = post(mw.FormDataContentType(), "", &mp)
	if b := ta.mgr.build; rec.Code != http.StatusCreated || b.Name != "app2" || b.BuildArgs["K"] != "V" || ta.mgr.buildContext != "CTX" {
		t.Fatalf("multipart build: %d %s; request %+v", rec.Code, rec.Body, b)
	}

	for query, field := range map[string]string{"?name=a&bogus=1": "bogus", "?name=a&no_cache=maybe": "no_cache", "?name=a&build_arg=NOEQ": "build_arg"} {
		if rec := post("application/x-tar", query, &bytes.Buffer{}); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), field) {
			t.Errorf("%s: %d %s, want a 422 naming %s", query, rec.Code, rec.Body, field)
		}
	}
	// JSON is the protocol's create, untouched.
	if st, _ := ta.do(t, "POST", "/v2/sandboxes/snapshots", memberKey, map[string]any{"name": "s", "docker_image": "busybox", "fs_capacity_bytes": 1 << 30}); st != http.StatusCreated {
		t.Fatalf("JSON create: %d", st)
	}
}

// TestBuildLogRoute checks the step log streams as text, and that an
// unknown snapshot is a 404.
func TestBuildLogRoute(t *testing.T) {
	ta := newTestAPI(t, false)
	post := httptest.NewRequest("POST", "/v2/sandboxes/snapshots?name=app", strings.NewReader("CTX"))
	post.Header.Set("X-Api-Key", memberKey)
	post.Header.Set("Content-Type", "application/x-tar")
	ta.srv.ServeHTTP(httptest.NewRecorder(), post)
	st, body := ta.do(t, "GET", "/v2/sandboxes/snapshots/sn-built/build-log", memberKey, nil)
	if st != http.StatusOK || body != "#1 [stage 1/1] FROM busybox\nCTX" {
		t.Fatalf("build-log: %d %q", st, body)
	}
	if st, _ := ta.do(t, "GET", "/v2/sandboxes/snapshots/nope/build-log", memberKey, nil); st != http.StatusNotFound {
		t.Fatalf("unknown snapshot's build-log: %d", st)
	}
}
