package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newDaemonDouble is a TEST DOUBLE of the daemon for the client commands:
// one sandbox "box" whose exec echoes the command line and exits 7, and an
// in-memory file store. The real daemon is tested under test/e2e.
func newDaemonDouble(t *testing.T) (files map[string][]byte) {
	files = map[string][]byte{}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv(envEndpoint, srv.URL)
	t.Setenv(envAPIKey, "k")
	mux.HandleFunc("GET /v2/sandboxes/boxes/box", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(protocol.Sandbox{Name: "box", Status: "ready", DataplaneURL: srv.URL + "/dp"})
	})
	mux.HandleFunc("GET /dp/execute/ws", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		var f protocol.ExecFrame
		_, b, _ := conn.Read(r.Context())
		json.Unmarshal(b, &f)
		zero, code := int64(0), 7
		for _, reply := range []protocol.ExecFrame{
			{Type: "started", CommandID: f.CommandID},
			{Type: "stdout", Data: f.Shell + " -c " + f.Command, Offset: &zero},
			{Type: "stderr", Data: "warn", Offset: &zero},
			{Type: "exit", ExitCode: &code},
		} {
			b, _ := json.Marshal(reply)
			conn.Write(r.Context(), websocket.MessageText, b)
		}
		conn.Close(websocket.StatusNormalClosure, "")
	})
	mux.HandleFunc("POST /dp/upload", func(w http.ResponseWriter, r *http.Request) {
		f, _, err := r.FormFile("file")
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		files[r.URL.Query().Get("path")], _ = io.ReadAll(f)
	})
	mux.HandleFunc("GET /dp/download", func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Query().Get("path")]
		if !ok {
			w.WriteHeader(404)
			io.WriteString(w, `{"detail":{"error":"FileNotFound","message":"no such file"}}`)
			return
		}
		w.Write(b)
	})
	return files
}

func runCmd(cmd *cobra.Command, stdin string, args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&o)
	cmd.SetErr(&e)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err = cmd.Execute()
	return o.String(), e.String(), err
}

func TestExecCmdStreamsAndExitsWithCode(t *testing.T) {
	newDaemonDouble(t)
	out, errOut, err := runCmd(newExecCmd(), "", "box", "--", "echo", "a b")
	var ec exitCode
	if !errors.As(err, &ec) || ec != 7 {
		t.Fatalf("err = %v, want exitCode(7)", err)
	}
	if out != "/bin/sh -c echo 'a b'" || errOut != "warn" {
		t.Errorf("stdout %q, stderr %q", out, errOut)
	}
}

func TestCpRoundTrip(t *testing.T) {
	files := newDaemonDouble(t)
	dir := t.TempDir()
	local := filepath.Join(dir, "in.txt")
	os.WriteFile(local, []byte("payload"), 0o600)
	if _, _, err := runCmd(newCpCmd(), "", local, "box:/work/"); err != nil {
		t.Fatal(err)
	}
	if string(files["/work/in.txt"]) != "payload" {
		t.Fatalf("uploaded %q", files)
	}
	if _, _, err := runCmd(newCpCmd(), "from stdin", "-", "box:/s.txt"); err != nil || string(files["/s.txt"]) != "from stdin" {
		t.Fatalf("stdin upload: %v, %q", err, files["/s.txt"])
	}
	if _, _, err := runCmd(newCpCmd(), "", "box:/work/in.txt", dir+"/"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "in.txt")); string(b) != "payload" {
		t.Errorf("downloaded %q", b)
	}
	out, _, err := runCmd(newCpCmd(), "", "box:/s.txt", "-")
	if err != nil || out != "from stdin" {
		t.Errorf("download to stdout: %q, %v", out, err)
	}
	if _, _, err := runCmd(newCpCmd(), "", "box:/missing", filepath.Join(dir, "m")); err == nil {
		t.Error("missing file copied")
	}
	if _, err := os.Stat(filepath.Join(dir, "m")); !os.IsNotExist(err) {
		t.Error("a failed download left a file behind")
	}
}

func TestMissingAPIKeyIsClear(t *testing.T) {
	t.Setenv(envAPIKey, "")
	_, _, err := runCmd(newSandboxLsCmd(), "")
	if err == nil || !strings.Contains(err.Error(), envAPIKey) {
		t.Errorf("err = %v, want a message naming %s", err, envAPIKey)
	}
}

// TestMemoryFlags: --preserve-memory-on-stop and --docker reach the
// create body and --restore-memory the start body; left out, none is sent.
func TestMemoryFlags(t *testing.T) {
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv(envEndpoint, srv.URL)
	t.Setenv(envAPIKey, "k")
	var bodies []string
	record := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, strings.TrimSpace(string(b)))
		json.NewEncoder(w).Encode(protocol.Sandbox{Name: "box", Status: "ready"})
	}
	mux.HandleFunc("POST /v2/sandboxes/boxes", record)
	mux.HandleFunc("POST /v2/sandboxes/boxes/box/start", record)
	ready := func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(protocol.Sandbox{Name: "box", Status: "ready"})
	}
	mux.HandleFunc("GET /v2/sandboxes/boxes/box", ready)
	mux.HandleFunc("GET /v2/sandboxes/boxes/box/status", ready)
	for _, c := range []struct {
		cmd  *cobra.Command
		args []string
		want string // in the body; "" checks memory options are absent
	}{
		{newSandboxCreateCmd(), []string{"--preserve-memory-on-stop"}, `"preserve_memory_on_stop":true`},
		{newSandboxCreateCmd(), nil, ""},
		{newSandboxCreateCmd(), []string{"--docker"}, `"docker":true`},
		{newSandboxCreateCmd(), []string{"--docker=false"}, `"docker":false`},
		{newSandboxCreateCmd(), []string{"--runtime", "microvm"}, `"runtime":"microvm"`},
		{newSandboxStartCmd(), []string{"box", "--restore-memory=false"}, `"restore_memory":false`},
		{newSandboxStartCmd(), []string{"box", "--restore-memory"}, `"restore_memory":true`},
		{newSandboxStartCmd(), []string{"box"}, ""},
	} {
		bodies = nil
		if _, _, err := runCmd(c.cmd, "", c.args...); err != nil || len(bodies) != 1 {
			t.Fatalf("%v: %v, %d requests", c.args, err, len(bodies))
		}
		if c.want != "" && !strings.Contains(bodies[0], c.want) || c.want == "" && (strings.Contains(bodies[0], "memory") || strings.Contains(bodies[0], "docker")) {
			t.Errorf("%v sent %s, want %q", c.args, bodies[0], c.want)
		}
	}
}

// TestShareCmds: share, share ls and share rm send what the API takes,
// for sandboxes and (--snapshot) snapshots; --with workspace shares with
// the whole workspace.
func TestShareCmds(t *testing.T) {
	got := recordingAPI(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case http.MethodGet:
			json.NewEncoder(w).Encode(protocol.ShareList{Shares: []protocol.Share{{ID: "s1", Grantee: "*", Access: "read", CreatedBy: "ann"}}})
		default:
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(protocol.Share{ID: "s2", Grantee: "bob", Access: "use", CreatedBy: "ann"})
		}
	})
	out, _, err := runCmd(newShareCmd(), "", "box", "--with", "bob", "--access", "use")
	if err != nil || !strings.Contains(out, "s2") || !strings.Contains(out, "bob") {
		t.Fatalf("share: %q %v", out, err)
	}
	if _, _, err := runCmd(newShareCmd(), "", "snap-1", "--snapshot", "--with", "workspace"); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCmd(newShareCmd(), "", "ls", "box")
	if err != nil || !strings.Contains(out, "workspace") {
		t.Fatalf("share ls: %q %v", out, err)
	}
	if _, _, err := runCmd(newShareCmd(), "", "rm", "--snapshot", "snap-1", "s1"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`POST /v2/sandboxes/boxes/box/shares {"user_id":"bob","access":"use"}`,
		`POST /v2/sandboxes/snapshots/snap-1/shares {"workspace":true,"access":"read"}`,
		`GET /v2/sandboxes/boxes/box/shares `,
		`DELETE /v2/sandboxes/snapshots/snap-1/shares/s1 `,
	}
	if strings.Join(*got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(*got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSnapshotPoolCmd(t *testing.T) {
	got := recordingAPI(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(protocol.SnapshotPool{SnapshotID: "s1", Size: 4, MaxAgeSeconds: 600, Ready: 3})
	})
	out, _, err := runCmd(newSnapshotPoolCmd(), "", "base", "--size", "4", "--max-age", "10m")
	if err != nil || !strings.Contains(out, "size 4") || !strings.Contains(out, "ready 3") || !strings.Contains(out, "max age 10m0s") {
		t.Fatalf("pool: %q %v", out, err)
	}
	if _, _, err := runCmd(newSnapshotPoolCmd(), "", "base"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`PUT /v2/sandboxes/snapshots/base/pool {"size":4,"max_age_seconds":600}`,
		`GET /v2/sandboxes/snapshots/base/pool `,
	}
	if strings.Join(*got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(*got, "\n"), strings.Join(want, "\n"))
	}
}

// recordingAPI points the CLI at a test server whose handler is respond
// and returns the requests it received, each "METHOD PATH BODY".
func recordingAPI(t *testing.T, respond http.HandlerFunc) *[]string {
	t.Helper()
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(string(b)))
		respond(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Setenv(envAPIKey, "k")
	t.Setenv(envEndpoint, srv.URL)
	return &got
}
