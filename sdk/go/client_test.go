package cubicle

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestErrorMapping(t *testing.T) {
	d := newFakeDaemon(t)
	d.mux.HandleFunc("GET /v2/sandboxes/snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "NotFound", Message: "no snapshot " + r.PathValue("id")}})
	})
	d.mux.HandleFunc("POST /v2/sandboxes/boxes", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, `{"detail":[{"loc":["body","vcpus"],"msg":"must be at most 8","type":"value_error"},{"loc":["body","items",0],"msg":"bad","type":"value_error"}]}`)
	})
	d.mux.HandleFunc("POST /v2/sandboxes/snapshots", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusConflict, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "Conflict", Message: "name taken"}})
	})
	d.mux.HandleFunc("DELETE /v2/sandboxes/boxes/{name}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html>oops</html>")
	})
	c := d.client()
	ctx := t.Context()

	_, err := c.GetSnapshot(ctx, "nope")
	if !IsNotFound(err) || IsConflict(err) {
		t.Errorf("404: IsNotFound = false for %v", err)
	}

	vcpus := int64(99)
	_, err = c.CreateSandbox(ctx, protocol.CreateSandboxRequest{VCPUs: &vcpus})
	var ae *APIError
	if !errors.As(err, &ae) {
		t.Fatalf("422: err %v is not an *APIError", err)
	}
	if ae.Status != 422 || ae.Message != "must be at most 8; bad" || ae.Field != "vcpus" || ae.Type != "ValidationError" {
		t.Errorf("422: got %+v", ae)
	}

	_, err = c.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "n", DockerImage: "alpine"})
	if !IsConflict(err) || !strings.Contains(err.Error(), "name taken") {
		t.Errorf("409: IsConflict = false or no message in %v", err)
	}

	err = c.DeleteSandbox(ctx, "box")
	if !errors.As(err, &ae) || ae.Message != "HTTP 502: Bad Gateway" {
		t.Errorf("non-JSON 502: got %v", err)
	}

	_, err = New(d.srv.URL, "wrong").GetSandbox(ctx, "box")
	if !errors.As(err, &ae) || ae.Status != 401 || ae.Type != "Unauthorized" {
		t.Errorf("bad key: got %v", err)
	}
}

func TestParseErrorPlainAndErrorID(t *testing.T) {
	if ae := parseError(400, []byte(`{"detail":"just text"}`)); ae.Message != "just text" {
		t.Errorf("plain detail: %+v", ae)
	}
	ae := parseError(500, []byte(`{"detail":{"error":"Internal","message":"boom","error_id":"e1"}}`))
	if ae.Type != "Internal" || ae.Message != "boom (error_id=e1)" {
		t.Errorf("error_id: %+v", ae)
	}
}

// WriteFile streams: the request has no Content-Length (so the SDK did not
// buffer it), and the one "file" part holds exactly the source bytes.
func TestWriteFileStreamsExactBytes(t *testing.T) {
	d := newFakeDaemon(t)
	var gotSum [32]byte
	var gotPath string
	d.mux.HandleFunc("POST /dp/{name}/upload", func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.Query().Get("path")
		if r.ContentLength != -1 {
			t.Errorf("Content-Length = %d, want -1 (streamed)", r.ContentLength)
		}
		mr, err := r.MultipartReader()
		if err != nil {
			t.Errorf("multipart: %v", err)
			return
		}
		part, err := mr.NextPart()
		if err != nil || part.FormName() != "file" {
			t.Errorf("first part %v, %v; want the file part", part, err)
			return
		}
		h := sha256.New()
		io.Copy(h, part)
		copy(gotSum[:], h.Sum(nil))
		if _, err := mr.NextPart(); err != io.EOF {
			t.Errorf("more than one part: %v", err)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	const size = 8<<20 + 17
	src := sha256.New()
	// struct{io.Reader} hides any Len method, so nothing can pre-size it.
	r := struct{ io.Reader }{io.TeeReader(io.LimitReader(rand.Reader, size), src)}
	if err := d.client().WriteFile(t.Context(), "box", "/tmp/a b/c.bin", r); err != nil {
		t.Fatal(err)
	}
	if gotPath != "/tmp/a b/c.bin" {
		t.Errorf("path = %q", gotPath)
	}
	if !bytes.Equal(gotSum[:], src.Sum(nil)) {
		t.Error("uploaded bytes differ from the source")
	}
}

func TestWriteFileSourceErrorAborts(t *testing.T) {
	d := newFakeDaemon(t)
	d.mux.HandleFunc("POST /dp/{name}/upload", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	boom := errors.New("disk on fire")
	r := io.MultiReader(strings.NewReader("partial"), iotestErrReader{boom})
	if err := d.client().WriteFile(t.Context(), "box", "/x", r); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the source's error", err)
	}
}

type iotestErrReader struct{ err error }

func (r iotestErrReader) Read([]byte) (int, error) { return 0, r.err }

func TestReadFileAndRun(t *testing.T) {
	d := newFakeDaemon(t)
	d.mux.HandleFunc("GET /dp/{name}/download", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") != "/etc/hostname" {
			writeJSON(w, http.StatusNotFound, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "FileNotFound", Message: "no such file"}})
			return
		}
		io.WriteString(w, "box\n")
	})
	d.mux.HandleFunc("POST /dp/{name}/execute", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"stdout":"hi\n","stderr":""}`) // exit_code missing → -1
	})
	c := d.client()
	rc, err := c.ReadFile(t.Context(), "box", "/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "box\n" {
		t.Errorf("ReadFile = %q", b)
	}
	if _, err := c.ReadFile(t.Context(), "box", "/nope"); !IsNotFound(err) {
		t.Errorf("missing file: %v", err)
	}
	res, err := c.Run(t.Context(), "box", "echo hi")
	if err != nil || res.Stdout != "hi\n" || res.ExitCode != -1 {
		t.Errorf("Run = %+v, %v", res, err)
	}
}

func TestWaitSnapshotFailedCarriesStatusMessage(t *testing.T) {
	d := newFakeDaemon(t)
	var polls atomic.Int32
	d.mux.HandleFunc("GET /v2/sandboxes/snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		s := protocol.Snapshot{ID: r.PathValue("id"), Name: "web", Status: protocol.SnapshotBuilding, PullBytesTotal: 100}
		switch polls.Add(1) {
		case 1:
		case 2:
			s.PullBytesDone = 50
		default:
			s.Status, s.StatusMessage, s.PullBytesTotal = protocol.SnapshotFailed, "pull nginx:nope: manifest unknown", 0
		}
		writeJSON(w, http.StatusOK, s)
	})
	var seen []int64
	s, err := d.client().WaitSnapshot(t.Context(), "snap-1", func(s protocol.Snapshot) { seen = append(seen, s.PullBytesDone) })
	if !errors.Is(err, ErrSnapshotFailed) || !strings.Contains(err.Error(), "manifest unknown") {
		t.Fatalf("err = %v, want ErrSnapshotFailed with the status message", err)
	}
	if s == nil || s.Status != protocol.SnapshotFailed {
		t.Errorf("snapshot = %+v, want the failed snapshot", s)
	}
	if len(seen) != 3 || seen[1] != 50 {
		t.Errorf("progress = %v, want 3 polls with 50 bytes done at the second", seen)
	}
}

func TestNewKeepsAPIPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"http://h:8080":                  "http://h:8080/v2/sandboxes",
		"http://h:8080/":                 "http://h:8080/v2/sandboxes",
		"http://h/api/v2/sandboxes":      "http://h/api/v2/sandboxes",
		"https://h/prefix/v2/sandboxes/": "https://h/prefix/v2/sandboxes",
	} {
		if got := New(in, "k").base; got != want {
			t.Errorf("New(%q).base = %q, want %q", in, got, want)
		}
	}
}

// TestListOptionsQuery: every list option becomes its query parameter,
// labels repeated; with a cursor the page size is sent as page_size.
func TestListOptionsQuery(t *testing.T) {
	got := ListOptions{NameContains: "a", Limit: 5, Labels: []string{"team", "env=dev"}, SortBy: "name", SortOrder: "desc",
		CreatedBy: "me", Status: "ready"}.query()
	if want := "?created_by=me&label=team&label=env%3Ddev&limit=5&name_contains=a&sort_by=name&sort_order=desc&status=ready"; got != want {
		t.Errorf("query %s, want %s", got, want)
	}
	if got := (ListOptions{Limit: 2, Cursor: "k1.x"}).query(); got != "?cursor=k1.x&page_size=2" {
		t.Errorf("cursor query %s", got)
	}
	if got := (ListOptions{}).query(); got != "" {
		t.Errorf("empty options query %q", got)
	}
}
