package filerec

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// fakeLayers puts every sandbox's files in one upper over one lower.
type fakeLayers struct{ upper, lower string }

func (f fakeLayers) FileLayers(context.Context, string) (string, []string, error) {
	return f.upper, []string{f.lower}, nil
}

func put(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

const stanzas = `Package: base-files
Status: install ok installed
Version: 12.4
Description: base
 a continuation line: with a colon

Package: old-tool
Status: install ok installed
Version: 1.0

Package: gone-conf
Status: deinstall ok config-files
Version: 0.9

Package: libfoo
Status: install ok installed
Version: 2.0
`

func TestParseDpkgStatus(t *testing.T) {
	got := parseDpkgStatus([]byte(stanzas))
	want := map[string]string{"base-files": "12.4", "old-tool": "1.0", "libfoo": "2.0"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// session is a Watcher over a plain upper and lower dir (the Tracker
// walks them) recording into an in-memory recorder.
type session struct {
	t            *testing.T
	w            *Watcher
	rec          *sandboxtest.Recorder
	upper, lower string
}

func newSession(t *testing.T) *session {
	s := &session{t: t, rec: &sandboxtest.Recorder{}, upper: t.TempDir(), lower: t.TempDir()}
	s.w = New(s.rec, fakeLayers{s.upper, s.lower}, nil)
	t.Cleanup(s.w.Close)
	return s
}

// command runs fn as command step between its start and end hooks and
// returns the events recorded for it.
func (s *session) command(step int64, fn func()) []sandboxtest.Recorded {
	ctx := context.Background()
	before := len(s.rec.Events("sb"))
	s.w.CommandStarting(ctx, "sb")
	fn()
	s.w.CommandEnded(ctx, "sb", "ws", step)
	s.w.CommandStarting(ctx, "sb") // waits for the scan
	return s.rec.Events("sb")[before:]
}

func TestPackageEvents(t *testing.T) {
	testenv.RequireRoot(t, "makes overlay whiteouts (char 0/0)")
	s := newSession(t)
	put(t, s.lower+"/var/lib/dpkg/status", stanzas)
	put(t, s.lower+"/usr/lib/python3/dist-packages/requests-2.0.dist-info/METADATA", "Name: requests\n")
	put(t, s.lower+"/usr/lib/python3/dist-packages/six-1.16.dist-info/METADATA", "Name: six\n")
	put(t, s.lower+"/app/node_modules/left-pad/package.json", `{"name":"left-pad","version":"1.0.0"}`)
	put(t, s.lower+"/app/node_modules/rimraf/package.json", `{"name":"rimraf","version":"3.0.0"}`)

	if evs := s.command(1, func() {}); len(evs) != 0 {
		t.Fatalf("a command touching nothing recorded %v", evs)
	}
	evs := s.command(2, func() {
		// apt: libfoo upgraded, old-tool removed, newpkg installed.
		st := strings.Replace(stanzas, "Version: 2.0", "Version: 2.1", 1)
		st = strings.Replace(st, "Package: old-tool\nStatus: install ok installed", "Package: old-tool\nStatus: deinstall ok config-files", 1)
		put(t, s.upper+"/var/lib/dpkg/status", st+"\nPackage: newpkg\nStatus: install ok installed\nVersion: 0.1-1\n")
		// pip: requests upgraded (old dist-info whited out), foo installed, six removed.
		whiteout(t, s.upper+"/usr/lib/python3/dist-packages/requests-2.0.dist-info")
		whiteout(t, s.upper+"/usr/lib/python3/dist-packages/six-1.16.dist-info")
		put(t, s.upper+"/usr/lib/python3/dist-packages/requests-2.1.dist-info/METADATA", "Name: requests\n")
		put(t, s.upper+"/usr/lib/python3/dist-packages/foo-1.2.dist-info/METADATA", "Name: foo\n")
		// npm: left-pad upgraded (copied up), @scope/x installed, rimraf removed.
		put(t, s.upper+"/app/node_modules/left-pad/package.json", `{"name":"left-pad","version":"1.3.0"}`)
		put(t, s.upper+"/app/node_modules/@scope/x/package.json", `{"name":"@scope/x","version":"0.2.0"}`)
		put(t, s.upper+"/app/node_modules/@scope/x/lib/package.json", `{"name":"not-a-package","version":"9"}`)
		whiteout(t, s.upper+"/app/node_modules/rimraf")
	})
	var got []string
	for _, e := range evs {
		if e.Step != 2 {
			t.Errorf("event %s has step %d, want 2", e.Type, e.Step)
		}
		if e.Kind != protocol.KindPackage {
			continue
		}
		p := e.Data.(protocol.PackageChange)
		got = append(got, strings.Join([]string{e.Type, p.Ecosystem, p.Name, p.Version, p.PreviousVersion}, " "))
	}
	want := []string{
		"package.upgraded dpkg libfoo 2.1 2.0",
		"package.installed dpkg newpkg 0.1-1 ",
		"package.removed dpkg old-tool 1.0 ",
		"package.installed pip foo 1.2 ",
		"package.upgraded pip requests 2.1 2.0",
		"package.removed pip six 1.16 ",
		"package.installed npm @scope/x 0.2.0 ",
		"package.upgraded npm left-pad 1.3.0 1.0.0",
		"package.removed npm rimraf 3.0.0 ",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("package events:\n got %q\nwant %q", got, want)
	}
	if evs[0].Type != protocol.EventFileChanged {
		t.Fatalf("first event %s, want file.changed", evs[0].Type)
	}

	// The next change compares with what the last scan read, not the lower.
	evs = s.command(3, func() {
		put(t, s.upper+"/app/node_modules/left-pad/package.json", `{"name":"left-pad","version":"1.3.1"}`)
		os.RemoveAll(s.upper + "/app/node_modules/@scope/x")
	})
	got = nil
	for _, e := range evs {
		if p, ok := e.Data.(protocol.PackageChange); ok {
			got = append(got, strings.Join([]string{e.Type, p.Name, p.Version, p.PreviousVersion}, " "))
		}
	}
	want = []string{"package.removed @scope/x 0.2.0 ", "package.upgraded left-pad 1.3.1 1.3.0"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("second package events:\n got %q\nwant %q", got, want)
	}
}

func whiteout(t *testing.T, path string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := unix.Mknod(path, unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
}

// TestFileEvents checks a step's file.changed event: the paths it added,
// modified, deleted with sizes and modes, and the stop scan (step 0).
func TestFileEvents(t *testing.T) {
	s := newSession(t)
	put(t, s.lower+"/etc/conf", "abc")
	evs := s.command(5, func() {
		put(t, s.upper+"/etc/conf", "abcdef")
		put(t, s.upper+"/work/new.txt", "hello")
	})
	if len(evs) != 1 || evs[0].Type != protocol.EventFileChanged || evs[0].Step != 5 || evs[0].Kind != protocol.KindFile {
		t.Fatalf("events %+v", evs)
	}
	d := evs[0].Data.(protocol.FileChanges)
	b, _ := json.Marshal(d)
	const want = `{"added":[{"path":"/work","size":0,"mode":"drwxr-xr-x"},{"path":"/work/new.txt","size":5,"mode":"-rw-r--r--"}],` +
		`"modified":[{"path":"/etc/conf","size_before":3,"size":6,"mode":"-rw-r--r--"}],"added_count":2,"modified_count":1,"deleted_count":0}`
	if string(b) != want {
		t.Fatalf("file.changed data\n got %s\nwant %s", b, want)
	}

	// Changes after the last command show at stop, under step 0.
	os.Remove(s.upper + "/work/new.txt")
	s.w.Lifecycle(context.Background(), recordEvent("sb", protocol.EventStopped))
	s.w.CommandStarting(context.Background(), "sb")
	evs = s.rec.Events("sb")[1:]
	if len(evs) != 1 || evs[0].Step != 0 {
		t.Fatalf("stop scan: %+v", evs)
	}
	if d := evs[0].Data.(protocol.FileChanges); d.At != protocol.EventStopped || !reflect.DeepEqual(d.Deleted, []string{"/work/new.txt"}) {
		t.Fatalf("stop scan data %+v", d)
	}

	// A reset's stop scans nothing (the upper is being emptied); the
	// reset drops the index, rebuilt as the next command starts.
	put(t, s.upper+"/junk", "j")
	stop := recordEvent("sb", protocol.EventStopped)
	stop.Data = map[string]string{"reason": "reset"}
	s.w.Lifecycle(context.Background(), stop)
	s.w.Lifecycle(context.Background(), recordEvent("sb", protocol.EventReset))
	if evs := s.command(9, func() {}); len(evs) != 0 {
		t.Fatalf("reset: %+v", evs)
	}
	if evs := s.command(10, func() { os.Remove(s.upper + "/junk") }); len(evs) != 1 || evs[0].Step != 10 {
		t.Fatalf("after reset: %+v", evs)
	}
}

func TestFileDataCaps(t *testing.T) {
	var cs []storage.FileChange
	for _, p := range []string{"/a", "/b", "/c"} {
		cs = append(cs, storage.FileChange{Path: p, Kind: storage.Added})
	}
	cs = append(cs, storage.FileChange{Path: "/d", Kind: storage.Deleted})
	d := fileData(cs, 2)
	if len(d.Added) != 2 || d.Deleted != nil || d.AddedCount != 3 || d.DeletedCount != 1 || !d.Truncated {
		t.Fatalf("capped data %+v", d)
	}
}

func recordEvent(sandboxID, typ string) record.Event {
	return record.Event{SandboxID: sandboxID, WorkspaceID: "ws", Kind: protocol.KindLifecycle, Type: typ}
}
