package gvisor

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// TestDockerSpec: a sandbox with Docker inside gets the runsc flags, the
// capabilities, a /var/lib/docker tmpfs of half its memory and cgroupfs;
// one without gets none of them; and a checkpoint of the first restores
// with Docker inside whatever the restoring spec says.
func TestDockerSpec(t *testing.T) {
	d := &Driver{}
	base := runtime.Spec{ID: "0123456789abcdef0123456789abcdef", RootFS: t.TempDir(), AgentBinary: "/bin/true",
		NetNS: "/proc/self/ns/net", Limits: runtime.Limits{MemBytes: 1 << 30}}
	on := base
	on.Docker = true
	for _, c := range []struct {
		spec runtime.Spec
		want bool
	}{{base, false}, {on, true}} {
		args, _ := d.launchArgs(c.spec, "/b", "")
		if got := slices.Contains(args, "--net-raw") && slices.Contains(args, "--allow-packet-socket-write"); got != c.want {
			t.Errorf("docker %v: runsc args %v", c.want, args)
		}
		if i := slices.Index(args, "run"); i < 0 || slices.Index(args, "--net-raw") > i {
			t.Errorf("docker %v: flags must precede the subcommand: %v", c.want, args)
		}
		oci := ociSpec(c.spec, nil)
		if got := slices.Contains(oci.Process.Capabilities.Bounding, "CAP_SYS_ADMIN") && slices.Contains(oci.Process.Capabilities.Effective, "CAP_NET_ADMIN"); got != c.want {
			t.Errorf("docker %v: capabilities %v", c.want, oci.Process.Capabilities.Effective)
		}
		mounts := map[string]specs.Mount{}
		for _, m := range oci.Mounts {
			mounts[m.Destination] = m
		}
		lib, hasLib := mounts[dockerDir]
		cg, hasCG := mounts["/sys/fs/cgroup"]
		if hasLib != c.want || hasCG != c.want {
			t.Fatalf("docker %v: mounts %v", c.want, oci.Mounts)
		}
		if c.want && (lib.Type != "tmpfs" || !slices.Contains(lib.Options, "size=536870912") || cg.Type != "cgroup") {
			t.Errorf("docker mounts %+v %+v, want a tmpfs of 512 MiB and cgroupfs", lib, cg)
		}
		saved := savedSpecOf(oci)
		if saved.Docker != c.want {
			t.Errorf("docker %v: saved for restore as %v", c.want, saved.Docker)
		}
	}
	// A restore takes the checkpoint's docker, tmpfs included.
	saved := savedSpecOf(ociSpec(on, nil))
	restored := ociSpec(base, &saved)
	if !slices.ContainsFunc(restored.Mounts, func(m specs.Mount) bool { return m.Destination == dockerDir }) {
		t.Errorf("restored mounts lack %s: %v", dockerDir, restored.Mounts)
	}
}
