package build

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// fakeWorker makes layers as plain directories; RUN steps are recorded,
// not run (a command "exit N" fails with N).
type fakeWorker struct {
	t    *testing.T
	runs []RunSpec
	n    int
}

func (w *fakeWorker) newDir() (string, *os.Root) {
	w.n++
	dir := filepath.Join(w.t.TempDir(), fmt.Sprint(w.n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		w.t.Fatal(err)
	}
	return dir, r
}

func (w *fakeWorker) Base(_ context.Context, ref string) (Base, error) {
	if ref == "missing" {
		return Base{}, errdefs.ErrNotFound
	}
	return Base{Key: "image:" + ref, Layers: []string{"/base/" + ref}}, nil
}

func (w *fakeWorker) Run(_ context.Context, _ []string, spec RunSpec, out io.Writer) (Layer, error) {
	w.runs = append(w.runs, spec)
	fmt.Fprintf(out, "ran %s\n", spec.Command)
	var code int
	if _, err := fmt.Sscanf(spec.Command, "exit %d", &code); err == nil && code != 0 {
		return Layer{}, &ExitError{Code: code}
	}
	dir, r := w.newDir()
	defer r.Close()
	return Layer{ID: fmt.Sprint(w.n), Path: dir}, r.WriteFile("run", []byte(spec.Command), 0o644)
}

func (w *fakeWorker) Layer(_ context.Context, fill func(*os.Root) error) (Layer, error) {
	dir, r := w.newDir()
	defer r.Close()
	return Layer{ID: fmt.Sprint(w.n), Path: dir}, fill(r)
}

// Open merges the layers that are real directories, top one last.
func (w *fakeWorker) Open(_ context.Context, layers []string) (string, func(), error) {
	dir, r := w.newDir()
	r.Close()
	for _, l := range layers {
		if _, err := os.Stat(l); err != nil {
			continue
		}
		filepath.WalkDir(l, func(p string, d fs.DirEntry, err error) error {
			t := filepath.Join(dir, strings.TrimPrefix(p, l))
			if d.IsDir() {
				return os.MkdirAll(t, 0o755)
			}
			b, _ := os.ReadFile(p)
			return os.WriteFile(t, b, 0o644)
		})
	}
	return dir, func() {}, nil
}

type mapCache map[string]Layer

func (c mapCache) Get(_ context.Context, k string) (Layer, bool, error) {
	l, ok := c[k]
	return l, ok, nil
}
func (c mapCache) Put(_ context.Context, k string, l Layer) error { c[k] = l; return nil }

const testDockerfile = `ARG BASE=busybox
FROM ${BASE} AS build
ARG GREETING=hello
WORKDIR /src
COPY app.txt ./
RUN echo $GREETING > out.txt
FROM ${BASE}
ENV MODE=prod
LABEL team=core
COPY --from=build /src/app.txt /app/
COPY data /app/data
USER 1000
CMD ["app", "--serve"]
`

// writeContext makes a build context dir with files.
func writeContext(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func build(t *testing.T, w *fakeWorker, c Cache, df, ctxDir string, o Options) (*Result, string, error) {
	t.Helper()
	plan, err := Parse([]byte(df), "")
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	o.Context, o.Log = ctxDir, &log
	res, err := Build(context.Background(), plan, w, c, o)
	return res, log.String(), err
}

func TestBuildStepsAndRunConfig(t *testing.T) {
	w := &fakeWorker{t: t}
	dir := writeContext(t, map[string]string{"app.txt": "v1", "data/a": "a", "data/b": "b"})
	res, log, err := build(t, w, mapCache{}, testDockerfile, dir, Options{BuildArgs: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, log)
	}
	// WORKDIR, COPY, RUN in build; two COPYs in the final stage.
	if res.Steps != 5 || res.Cached != 0 {
		t.Fatalf("steps %d cached %d, want 5 and 0\n%s", res.Steps, res.Cached, log)
	}
	if len(w.runs) != 1 || w.runs[0].Config.EnvVars["GREETING"] != "hi" || w.runs[0].Config.WorkDir != "/src" {
		t.Fatalf("runs = %+v", w.runs)
	}
	if res.Config.User != "1000" || res.Config.EnvVars["MODE"] != "prod" || res.Labels["team"] != "core" {
		t.Fatalf("result config %+v labels %v", res.Config, res.Labels)
	}
	if res.StartCommand() != "exec 'app' '--serve'" || res.BaseRef != "busybox" {
		t.Fatalf("start command %q base %q", res.StartCommand(), res.BaseRef)
	}
	if len(res.Layers) != 3 || res.Layers[0] != "/base/busybox" {
		t.Fatalf("layers %v", res.Layers)
	}
	got, err := os.ReadFile(filepath.Join(res.Layers[1], "app", "app.txt"))
	if err != nil || string(got) != "v1" {
		t.Fatalf("COPY --from: %q %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(res.Layers[2], "app", "data", "b")); err != nil || string(b) != "b" {
		t.Fatalf("COPY dir: %q %v", b, err)
	}
}

func TestBuildCacheKeys(t *testing.T) {
	w := &fakeWorker{t: t}
	c := mapCache{}
	dir := writeContext(t, map[string]string{"app.txt": "v1", "data/a": "a"})
	if _, log, err := build(t, w, c, testDockerfile, dir, Options{}); err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	res, log, err := build(t, w, c, testDockerfile, dir, Options{})
	if err != nil || res.Cached != res.Steps || len(w.runs) != 1 || strings.Count(log, "CACHED") != 5 {
		t.Fatalf("unchanged rebuild: err %v, %d/%d cached, %d runs\n%s", err, res.Cached, res.Steps, len(w.runs), log)
	}
	// A changed data file invalidates only the last COPY.
	os.WriteFile(filepath.Join(dir, "data", "a"), []byte("A"), 0o644)
	if res, _, _ = build(t, w, c, testDockerfile, dir, Options{}); res.Steps-res.Cached != 1 || len(w.runs) != 1 {
		t.Fatalf("data change: %d of %d re-run, %d runs", res.Steps-res.Cached, res.Steps, len(w.runs))
	}
	// A changed app.txt re-runs its COPY, the RUN after it, and what
	// copies from that stage; the final stage's other COPY stacks on a
	// new parent, so it re-runs too.
	os.WriteFile(filepath.Join(dir, "app.txt"), []byte("v2"), 0o644)
	if res, _, _ = build(t, w, c, testDockerfile, dir, Options{}); res.Steps-res.Cached != 4 || len(w.runs) != 2 {
		t.Fatalf("app change: %d of %d re-run, %d runs", res.Steps-res.Cached, res.Steps, len(w.runs))
	}
	// A different build arg changes the RUN's key.
	if res, _, _ = build(t, w, c, testDockerfile, dir, Options{BuildArgs: map[string]string{"GREETING": "yo"}}); len(w.runs) != 3 || res.Cached != 2 {
		t.Fatalf("build arg change: %d runs, %d cached", len(w.runs), res.Cached)
	}
	if res, _, _ = build(t, w, c, testDockerfile, dir, Options{NoCache: true}); res.Cached != 0 || len(w.runs) != 4 {
		t.Fatalf("no_cache: %d cached, %d runs", res.Cached, len(w.runs))
	}
}

func TestBuildFailingRun(t *testing.T) {
	w := &fakeWorker{t: t}
	_, log, err := build(t, w, mapCache{}, "FROM busybox\nRUN echo ok\nRUN exit 3\nRUN echo never\n", t.TempDir(), Options{})
	var se *StepError
	var ee *ExitError
	if !errors.As(err, &se) || !errors.As(err, &ee) || ee.Code != 3 || se.Line != 3 || !strings.Contains(se.Output, "ran exit 3") {
		t.Fatalf("err = %v", err)
	}
	if len(w.runs) != 2 || strings.Contains(log, "never\n#") {
		t.Fatalf("runs %d\n%s", len(w.runs), log)
	}
}

func TestParseRefusesWithLine(t *testing.T) {
	for df, want := range map[string]string{
		"FROM busybox\nRUN true\nHEALTHCHECK CMD true\n":        "line 3: HEALTHCHECK",
		"FROM busybox\nBOGUS x\n":                               "line 2",
		"FROM busybox\nRUN --mount=type=cache,target=/x true\n": "line 2: RUN",
		"FROM busybox\nCOPY --chown=user:group a /a\n":          "line 2: COPY",
		"FROM busybox\nADD https://example.com/x /x\n":          "line 2: ADD",
		"RUN true\n": "dockerfile",
	} {
		_, err := Parse([]byte(df), "")
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != "dockerfile" || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want a dockerfile error with %q", df, err, want)
		}
	}
	if _, err := Parse([]byte("FROM a AS one\nFROM b\n"), "two"); err == nil || !strings.Contains(err.Error(), "target") {
		t.Errorf("unknown target: %v", err)
	}
}

func TestExtractContextDockerignore(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range map[string]string{
		".dockerignore": "*.log\nsecret/\n!keep.log\n", "Dockerfile": "FROM x\n",
		"a.txt": "a", "b.log": "b", "keep.log": "k", "secret/key": "s", "../escape": "x",
	} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	dir := t.TempDir()
	df, err := ExtractContext(dir, &buf, 1<<20)
	if err != nil || string(df) != "FROM x\n" {
		t.Fatalf("ExtractContext: %q %v", df, err)
	}
	for name, want := range map[string]bool{"a.txt": true, "keep.log": true, "b.log": false, "secret/key": false, "escape": true} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s present = %v, want %v", name, err == nil, want)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape")); err == nil {
		t.Error("a ../ name left the context dir")
	}
	if _, err := ExtractContext(t.TempDir(), bytes.NewReader(make([]byte, 4096)), 100); err == nil {
		t.Error("an oversize context was accepted")
	}
	// A header claiming more than the limit (as a sparse file would) is
	// refused before anything is written.
	var big bytes.Buffer
	tw = tar.NewWriter(&big)
	tw.WriteHeader(&tar.Header{Name: "huge", Mode: 0o644, Size: 1 << 40, Typeflag: tar.TypeReg})
	if _, err := ExtractContext(t.TempDir(), &big, 1<<20); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("a file claiming 1 TiB: %v", err)
	}
}

// TestStartCommand checks ENTRYPOINT and CMD combine as Docker runs them:
// CMD's argv after ENTRYPOINT's; the shell form runs in the SHELL.
func TestStartCommand(t *testing.T) {
	for df, want := range map[string]string{
		"FROM b\nENTRYPOINT [\"srv\", \"-v\"]\nCMD [\"--port\", \"80\"]\n": "exec 'srv' '-v' '--port' '80'",
		"FROM b\nCMD python -m http.server\n":                              "exec '/bin/sh' '-c' 'python -m http.server'",
		"FROM b\nSHELL [\"/bin/bash\", \"-c\"]\nCMD echo it's\n":           `exec '/bin/bash' '-c' 'echo it'\''s'`,
		"FROM b\nRUN true\n": "",
	} {
		res, log, err := build(t, &fakeWorker{t: t}, mapCache{}, df, t.TempDir(), Options{})
		if err != nil {
			t.Fatalf("%q: %v\n%s", df, err, log)
		}
		if got := res.StartCommand(); got != want {
			t.Errorf("%q: start command %q, want %q", df, got, want)
		}
	}
}

// TestBuildTarget checks a target stage builds only what it needs.
func TestBuildTarget(t *testing.T) {
	w := &fakeWorker{t: t}
	plan, err := Parse([]byte(testDockerfile), "build")
	if err != nil {
		t.Fatal(err)
	}
	dir := writeContext(t, map[string]string{"app.txt": "v1"})
	res, err := Build(context.Background(), plan, w, mapCache{}, Options{Context: dir})
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 3 || len(res.Layers) != 4 || res.Config.WorkDir != "/src" || res.Config.EnvVars["MODE"] != "" {
		t.Fatalf("target build: %d steps, layers %v, config %+v", res.Steps, res.Layers, res.Config)
	}
}

// TestAddUnpacksAndCopyFlags checks ADD unpacks a local (gzipped) tar
// while COPY copies it as a file, and --chmod/--chown apply.
func TestAddUnpacksAndCopyFlags(t *testing.T) {
	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "pkg/bin/tool", Mode: 0o755, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.WriteHeader(&tar.Header{Name: "pkg/link", Linkname: "bin/tool", Typeflag: tar.TypeSymlink})
	tw.Close()
	gz.Close()
	dir := writeContext(t, map[string]string{"pkg.tgz": tgz.String(), "conf": "c"})
	res, log, err := build(t, &fakeWorker{t: t}, mapCache{}, "FROM b\nADD pkg.tgz /opt/\nCOPY pkg.tgz /raw/\nCOPY --chmod=600 --chown=123:456 conf /etc/conf\n", dir, Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	if b, err := os.ReadFile(filepath.Join(res.Layers[1], "opt", "pkg", "bin", "tool")); err != nil || string(b) != "hi" {
		t.Fatalf("ADD did not unpack: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(res.Layers[1], "opt", "pkg", "link")); err != nil || l != "bin/tool" {
		t.Fatalf("symlink in the archive: %q %v", l, err)
	}
	if _, err := os.Stat(filepath.Join(res.Layers[2], "raw", "pkg.tgz")); err != nil {
		t.Fatalf("COPY of an archive: %v", err)
	}
	st, err := os.Stat(filepath.Join(res.Layers[3], "etc", "conf"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("--chmod: %v %v", st.Mode(), err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || sys.Uid != 123 || sys.Gid != 456 {
		t.Fatalf("--chown: %+v", st.Sys())
	}
}
