package e2b

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/e2b/envd/filesystem"
	"github.com/cubicle-dev/cubicle/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func fsClient(url, sandbox, key string) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(http.DefaultClient, url, connect.WithInterceptors(headers(sandbox, key)))
}

func dirMatch(p string) protocol.GlobMatch { return protocol.GlobMatch{Path: p, IsDir: true} }

func fileMatch(p string, size int64) protocol.GlobMatch {
	at := time.Unix(1700000000+size, 0)
	return protocol.GlobMatch{Path: p, SizeBytes: size, ModifiedAt: &at}
}

// TestStatAndListDir: a stat is a glob of the parent for the escaped
// base name; a listing keeps depth levels and refuses a file; a missing
// path is NotFound (the SDKs' NotFoundError).
func TestStatAndListDir(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	f.setGlob("/", dirMatch("/data"))
	f.setGlob("/data", dirMatch("/data/sub"), fileMatch("/data/a.txt", 3), fileMatch("/data/sub/b.txt", 5), fileMatch("/data/sub/deep/c", 1))
	c := fsClient(srv.URL, "box", keyA)
	st, err := c.Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: "/data/a.txt"}))
	if err != nil || st.Msg.GetEntry().GetSize() != 3 || st.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_FILE ||
		st.Msg.GetEntry().GetName() != "a.txt" || st.Msg.GetEntry().GetModifiedTime().AsTime().Unix() != 1700000003 {
		t.Fatalf("Stat = %v, %v", st, err)
	}
	_, err = c.Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: "/data/none"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Stat of a missing file: %v", err)
	}
	var paths []string
	l, err := c.ListDir(t.Context(), connect.NewRequest(&filesystem.ListDirRequest{Path: "/data", Depth: 2}))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range l.Msg.GetEntries() {
		paths = append(paths, e.GetPath())
	}
	if !slices.Equal(paths, []string{"/data/a.txt", "/data/sub", "/data/sub/b.txt"}) {
		t.Errorf("ListDir depth 2 = %q", paths)
	}
	_, err = c.ListDir(t.Context(), connect.NewRequest(&filesystem.ListDirRequest{Path: "/data/a.txt"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("ListDir of a file: %v, want InvalidArgument", err)
	}
	_, err = c.ListDir(t.Context(), connect.NewRequest(&filesystem.ListDirRequest{Path: "/nowhere/x"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ListDir of a missing dir: %v, want NotFound", err)
	}
}

// TestWatchDir: after the start event, listings that differ stream as
// create, write and remove events named relative to the directory.
func TestWatchDir(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	f.setGlob("/", dirMatch("/w"))
	f.setGlob("/w", fileMatch("/w/old", 1), fileMatch("/w/same", 2))
	st, err := fsClient(srv.URL, "box", keyA).WatchDir(t.Context(), connect.NewRequest(&filesystem.WatchDirRequest{Path: "/w"}))
	if err != nil || !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("watch start: %v %v", err, st.Err())
	}
	f.setGlob("/w", fileMatch("/w/same", 2), fileMatch("/w/new", 4))
	got := map[string]bool{}
	for len(got) < 2 && st.Receive() {
		ev := st.Msg().GetFilesystem()
		got[ev.GetType().String()+":"+ev.GetName()] = true
	}
	if !got["EVENT_TYPE_CREATE:new"] || !got["EVENT_TYPE_REMOVE:old"] {
		t.Errorf("events = %v", got)
	}
}

func TestChanges(t *testing.T) {
	e := func(p string, size int64) *filesystem.EntryInfo { return entry(fileMatch(p, size)) }
	evs := changes("/d", []*filesystem.EntryInfo{e("/d/a", 1), e("/d/b", 1)}, []*filesystem.EntryInfo{e("/d/b", 2), e("/d/c", 1)}, true)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.GetType().String()+":"+ev.GetName()+":"+ev.GetEntry().GetPath())
	}
	want := []string{"EVENT_TYPE_WRITE:b:/d/b", "EVENT_TYPE_CREATE:c:/d/c", "EVENT_TYPE_REMOVE:a:"}
	if !slices.Equal(got, want) {
		t.Errorf("changes = %q, want %q", got, want)
	}
}

func TestGlobEscape(t *testing.T) {
	if got := globEscape("a*b?[c].txt"); got != "a[*]b[?][[]c].txt" {
		t.Errorf("globEscape = %q", got)
	}
}

// envdRequest sends an envd HTTP request for sandbox "box" with keyA.
func envdRequest(t *testing.T, method, u, contentType string, body io.Reader) *http.Response {
	return envdRequestTo(t, "box", method, u, contentType, body)
}

func envdRequestTo(t *testing.T, sandbox, method, u, contentType string, body io.Reader) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, u, body)
	req.Header.Set("E2b-Sandbox-Id", sandbox)
	req.Header.Set("X-Access-Token", keyA)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestFilesUploadDownload: a multipart upload of several files names each
// by its filename (directories kept), an octet-stream one by ?path=, a
// relative path resolves under the home; downloads give the bytes and a
// missing file is 404.
func TestFilesUploadDownload(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for name, data := range map[string]string{"/x/one.txt": "1", "/x/sub/two.txt": "22"} {
		w, _ := mw.CreateFormFile("file", name)
		_, _ = io.WriteString(w, data)
	}
	mw.Close()
	if resp := envdRequest(t, "POST", srv.URL+"/files", mw.FormDataContentType(), &body); resp.StatusCode != 200 {
		t.Fatalf("multipart upload = %d", resp.StatusCode)
	}
	resp := envdRequest(t, "POST", srv.URL+"/files?path=rel.txt", "application/octet-stream", strings.NewReader("raw"))
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"path":"/root/rel.txt"`) {
		t.Fatalf("octet-stream upload = %d %s", resp.StatusCode, b)
	}
	if f.files["/x/one.txt"] != "1" || f.files["/x/sub/two.txt"] != "22" || f.files["/root/rel.txt"] != "raw" {
		t.Errorf("files = %v", f.files)
	}
	resp = envdRequest(t, "GET", srv.URL+"/files?path=/x/sub/two.txt", "", nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "22" {
		t.Errorf("download = %d %q", resp.StatusCode, b)
	}
	if resp := envdRequest(t, "GET", srv.URL+"/files?path=/nope", "", nil); resp.StatusCode != 404 {
		t.Errorf("download of a missing file = %d, want 404", resp.StatusCode)
	}
	if resp := envdRequest(t, "GET", srv.URL+"/health", "", nil); resp.StatusCode != 204 {
		t.Errorf("health = %d, want 204", resp.StatusCode)
	}
	// The SDKs' isRunning reads 502 as "not running".
	if resp := envdRequestTo(t, "paused-box", "GET", srv.URL+"/health", "", nil); resp.StatusCode != 502 {
		t.Errorf("health of a paused sandbox = %d, want 502", resp.StatusCode)
	}
}
