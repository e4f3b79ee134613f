package gvisor

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// TestTmpfsMountsAreSized checks that every writable memory-backed mount in
// the OCI config has a size inside the memory limit: /dev/shm always, /tmp
// unless the image keeps files there (a mount would hide them) or has a
// non-directory there. /dev itself, which runsc never sizes, is read-only.
func TestTmpfsMountsAreSized(t *testing.T) {
	l := runtime.Limits{MemBytes: 256 << 20}
	size := "size=67108864"
	for name, c := range map[string]struct {
		setup   func(tmp string)
		wantTmp bool
	}{
		"empty /tmp":     {func(tmp string) { os.Mkdir(tmp, 0o1777) }, true},
		"no /tmp":        {func(string) {}, true},
		"/tmp symlink":   {func(tmp string) { os.Symlink("/var/tmp", tmp) }, true},
		"image files":    {func(tmp string) { os.Mkdir(tmp, 0o1777); os.WriteFile(filepath.Join(tmp, "keep"), nil, 0o644) }, false},
		"/tmp is a file": {func(tmp string) { os.WriteFile(tmp, nil, 0o644) }, false},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			c.setup(filepath.Join(root, "tmp"))
			spec := ociSpec(runtime.Spec{ID: "x", RootFS: root, AgentBinary: "/bin/true", NetNS: "/proc/self/ns/net", Limits: l}, nil)
			got := map[string]specs.Mount{}
			for _, m := range spec.Mounts {
				got[m.Destination] = m
			}
			if !slices.Contains(got["/dev/shm"].Options, size) {
				t.Errorf("/dev/shm options %v, want %s", got["/dev/shm"].Options, size)
			}
			if !slices.Contains(got["/dev"].Options, "ro") {
				t.Errorf("/dev options %v, want ro", got["/dev"].Options)
			}
			tmp, ok := got["/tmp"]
			if ok != c.wantTmp {
				t.Fatalf("/tmp mounted: %v, want %v", ok, c.wantTmp)
			}
			if ok && (tmp.Type != "tmpfs" || !slices.Contains(tmp.Options, size)) {
				t.Errorf("/tmp mount %+v, want a tmpfs with %s", tmp, size)
			}
		})
	}
}

// TestTaskLimits checks the task bound both inside (RLIMIT_NPROC) and on
// the host (pids, and memory headroom for each task's host cost).
func TestTaskLimits(t *testing.T) {
	l := runtime.Limits{MemBytes: 1 << 30, PidsMax: 4096}
	var nproc uint64
	for _, r := range rlimits(l) {
		if r.Type == "RLIMIT_NPROC" {
			nproc = r.Hard
		}
	}
	if nproc != 1024 {
		t.Errorf("RLIMIT_NPROC %d, want 1024 (one per MiB of 1 GiB, under PidsMax 4096)", nproc)
	}
	if got := resources("sb", l).Pids.Limit; got != 3*1024+512 {
		t.Errorf("host pids limit %d", got)
	}
	if got, want := hostMemLimit(l), int64(1<<30+256<<20+256<<20+1024*hostTaskBytes); got != want {
		t.Errorf("host memory limit %d, want %d", got, want)
	}
}

// TestRestoreKeepsCheckpointSpec: a sandbox restored from a memory image
// gets the tmpfs mounts and rlimits its source was checkpointed with, even
// when its own mem_bytes differs (runsc refuses a restore whose rlimits or
// mounts differ from the checkpoint's).
func TestRestoreKeepsCheckpointSpec(t *testing.T) {
	src := runtime.Spec{ID: "src", RootFS: t.TempDir(), AgentBinary: "/bin/true", NetNS: "/proc/self/ns/net", Limits: runtime.Limits{MemBytes: 384 << 20}}
	bundle, image := t.TempDir(), t.TempDir()
	if err := writeBundle(bundle, src, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := bundleConfig(bundle)
	if err != nil {
		t.Fatal(err)
	}
	saved := savedSpecOf(cfg)
	if got, err := checkpointSpec(image); err != nil || got != nil {
		t.Fatalf("image without a saved spec: %+v, %v; want nil", got, err)
	}
	if got, err := checkpointSpec(""); err != nil || got != nil {
		t.Fatalf("cold boot: %+v, %v; want nil", got, err)
	}
	restored := src
	restored.Limits.MemBytes = 1 << 30
	fresh := ociSpec(restored, nil)
	if slices.EqualFunc(fresh.Process.Rlimits, cfg.Process.Rlimits, func(a, b specs.POSIXRlimit) bool { return a == b }) {
		t.Fatal("test premise: a different mem_bytes should derive different rlimits")
	}
	got := ociSpec(restored, &saved)
	if !slices.EqualFunc(got.Process.Rlimits, cfg.Process.Rlimits, func(a, b specs.POSIXRlimit) bool { return a == b }) {
		t.Errorf("restored rlimits %v, want the checkpoint's %v", got.Process.Rlimits, cfg.Process.Rlimits)
	}
	var gotShm, wantShm []string
	for _, m := range got.Mounts {
		if m.Destination == "/dev/shm" {
			gotShm = m.Options
		}
	}
	for _, m := range cfg.Mounts {
		if m.Destination == "/dev/shm" {
			wantShm = m.Options
		}
	}
	if !slices.Equal(gotShm, wantShm) {
		t.Errorf("restored /dev/shm options %v, want the checkpoint's %v", gotShm, wantShm)
	}
}
