package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestWriteJSONString: the piecewise encoding equals json.Marshal, with
// runes, invalid bytes and escapes across the 64 KiB piece boundaries.
func TestWriteJSONString(t *testing.T) {
	for _, s := range []string{
		"", "hi\n", strings.Repeat("é", 100000), strings.Repeat("a", 64<<10-1) + "€" + strings.Repeat("\x00", 70000),
		strings.Repeat("\xff\x80", 50000) + "<&>" + strings.Repeat("😀", 40000),
	} {
		var got bytes.Buffer
		writeJSONString(&got, s)
		want, _ := json.Marshal(s)
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("string of %d bytes: encodings differ", len(s))
		}
	}
}

// TestCappedOutput: output past the cap is counted, not kept, and a rune
// cut by the cap is dropped.
func TestCappedOutput(t *testing.T) {
	c := &cappedOutput{max: 10}
	c.Write([]byte("12345678"))
	c.Write([]byte("é€")) // 2+3 bytes: the cap cuts the € after 0 bytes
	c.Write([]byte(strings.Repeat("x", 1000)))
	if got := c.String(); got != "12345678é" || !c.truncated() || c.total != 1013 {
		t.Fatalf("kept %q truncated %v total %d", got, c.truncated(), c.total)
	}
	c = &cappedOutput{max: 10}
	c.Write([]byte("123456789€")) // the cap keeps one byte of the €
	if got := c.String(); got != "123456789" || !c.truncated() || c.total != 12 {
		t.Fatalf("kept %q truncated %v total %d", got, c.truncated(), c.total)
	}
	whole := &cappedOutput{max: 10}
	whole.Write([]byte("abc"))
	if whole.String() != "abc" || whole.truncated() {
		t.Fatalf("small output: %q %v", whole.String(), whole.truncated())
	}
}

// TestWriteExecuteResult: the streamed answer decodes to the result.
func TestWriteExecuteResult(t *testing.T) {
	res := protocol.ExecuteResult{Stdout: strings.Repeat("o\x01", 100000), Stderr: "e", ExitCode: 7, StdoutTruncated: true, StdoutBytes: 1 << 30}
	rec := httptest.NewRecorder()
	writeExecuteResult(rec, res)
	var got protocol.ExecuteResult
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got != res || !utf8.Valid(rec.Body.Bytes()) {
		t.Fatalf("decoded %+v, %v", got.ExitCode, err)
	}
}

// TestLayerExec: a command's run_config layers over the sandbox's (user
// and work_dir replace, env merges); the deprecated env/cwd fold into it;
// combining both forms, or a relative work_dir, is refused naming the field.
func TestLayerExec(t *testing.T) {
	base := protocol.RunConfig{User: "app", WorkDir: "/srv", EnvVars: map[string]string{"A": "1", "B": "2"}}
	f := protocol.ExecFrame{RunConfig: &protocol.RunConfig{WorkDir: "/tmp", EnvVars: map[string]string{"B": "3"}}}
	if err := layerExec(base, &f); err != nil {
		t.Fatal(err)
	}
	if rc := f.RunConfig; rc.User != "app" || rc.WorkDir != "/tmp" || rc.EnvVars["A"] != "1" || rc.EnvVars["B"] != "3" {
		t.Fatalf("layered %+v", rc)
	}
	f = protocol.ExecFrame{Env: map[string]string{"C": "4"}, Cwd: "/home"}
	if err := layerExec(base, &f); err != nil || f.RunConfig.WorkDir != "/home" || f.RunConfig.EnvVars["C"] != "4" || f.Env != nil || f.Cwd != "" {
		t.Fatalf("deprecated env/cwd: %v %+v", err, f)
	}
	var fe *errdefs.FieldError
	for _, c := range []struct {
		f     protocol.ExecFrame
		field string
	}{
		{protocol.ExecFrame{RunConfig: &protocol.RunConfig{}, Cwd: "/x"}, "run_config"},
		{protocol.ExecFrame{RunConfig: &protocol.RunConfig{}, Env: map[string]string{"A": "b"}}, "run_config"},
		{protocol.ExecFrame{RunConfig: &protocol.RunConfig{WorkDir: "rel"}}, "run_config.work_dir"},
		{protocol.ExecFrame{Cwd: "rel"}, "run_config.work_dir"},
	} {
		if err := layerExec(base, &c.f); !errors.As(err, &fe) || fe.Field != c.field {
			t.Fatalf("%+v: %v, want a %s field error", c.f, err, c.field)
		}
	}
}

// TestInWorkDir: a relative file path resolves in the sandbox's
// run_config.work_dir; absolute paths, and any path without a work_dir
// (the agent resolves it in the user's home), pass unchanged.
func TestInWorkDir(t *testing.T) {
	srv := protocol.RunConfig{WorkDir: "/srv/app"}
	for _, c := range []struct {
		rc      protocol.RunConfig
		in, out string
	}{
		{srv, "data.txt", "/srv/app/data.txt"},
		{srv, "out/../out/x.json", "/srv/app/out/x.json"},
		{srv, "../../../etc/passwd", "/etc/passwd"},
		{srv, "/tmp/a", "/tmp/a"},
		{protocol.RunConfig{}, "data.txt", "data.txt"},
	} {
		if got := inWorkDir(c.rc, c.in); got != c.out {
			t.Errorf("inWorkDir(%q, %q) = %q, want %q", c.rc.WorkDir, c.in, got, c.out)
		}
	}
}

// TestMatchWriter: a search answer is valid JSON whether it has no match,
// several, or was cut short.
func TestMatchWriter(t *testing.T) {
	for _, n := range []int{0, 1, 3} {
		rec := httptest.NewRecorder()
		m := &matchWriter{w: rec}
		for i := range n {
			if err := m.add(map[string]int{"line": i}); err != nil {
				t.Fatal(err)
			}
		}
		m.finish(n == 3)
		var got struct {
			Matches   []map[string]int `json:"matches"`
			Truncated bool             `json:"truncated"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || len(got.Matches) != n || got.Truncated != (n == 3) {
			t.Fatalf("%d matches: %q (%v)", n, rec.Body.String(), err)
		}
	}
}

// TestRelayedStatus: what the request or the files caused passes through;
// an agent fault or anything odd is a 502.
func TestRelayedStatus(t *testing.T) {
	for in, want := range map[int]int{200: 200, 206: 206, 304: 304, 404: 404, 416: 416, 500: 502, 503: 502, 101: 502, 0: 502} {
		if got := relayedStatus(in); got != want {
			t.Fatalf("relayedStatus(%d) = %d, want %d", in, got, want)
		}
	}
}
