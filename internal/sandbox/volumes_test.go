package sandbox

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// createVolume creates volume name of 64 MiB as p.
func (e *env) createVolume(t *testing.T, p auth.Principal, name string) *VolumeView {
	t.Helper()
	v, err := e.m.CreateVolume(as(p), protocol.CreateVolumeRequest{Name: name, SizeBytes: 64 << 20})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return v
}

// mountsOf is what sandbox id's running instance was started (or
// restored) with.
func (e *env) mountsOf(t *testing.T, id string) []runtime.Mount {
	t.Helper()
	spec, ok := e.driver.Spec(runtimeID(id))
	if !ok {
		t.Fatalf("sandbox %s has no instance", id)
	}
	return spec.Mounts
}

// TestVolumesMountedOnEveryBoot: a sandbox's volumes are bound in on its
// first boot, after a stop and start, after a memory-preserving stop's
// restore, and in every branch of a fork (files and memory); a second
// sandbox mounts the same directory; a detach applies at the next start.
func TestVolumesMountedOnEveryBoot(t *testing.T) {
	rec := &sandboxtest.Recorder{}
	e := newEnv(t, withRecorder(rec))
	ctx := as(member)
	data, ref := e.createVolume(t, member, "data"), e.createVolume(t, admin, "ref")
	want := []runtime.Mount{
		{Source: e.storage.VolumePath(data.ID), Target: "/data"},
		{Source: e.storage.VolumePath(ref.ID), Target: "/ref", ReadOnly: true},
	}
	atts := []protocol.VolumeAttachment{{Name: "data", MountPath: "/data"}, {Name: "ref", MountPath: "/ref", ReadOnly: true}}
	check := func(what, id string, want []runtime.Mount) {
		t.Helper()
		if got := e.mountsOf(t, id); !slices.Equal(got, want) {
			t.Fatalf("%s: mounts %+v, want %+v", what, got, want)
		}
	}
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "a", Volumes: atts, PreserveMemoryOnStop: ptr(true)})
	if err != nil || sb.Status != protocol.StatusReady {
		t.Fatalf("create with volumes: %+v %v", sb, err)
	}
	check("first boot", sb.ID, want)
	if got := VolumeAttachments(e.get(t, sb.ID)); !slices.Equal(got, atts) {
		t.Fatalf("recorded attachments %+v", got)
	}
	if _, err := e.m.StopSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, sb.ID, true)
	check("memory restore", sb.ID, want)
	e.reopen(t)
	if got := e.m.mountedBy(data.ID); !slices.Equal(got, []string{sb.ID}) {
		t.Fatalf("after a daemon restart, volume mounted by %v", got)
	}
	for _, mem := range []bool{false, true} {
		res, err := e.m.Fork(ctx, "a", protocol.ForkRequest{Count: 1, IncludeMemory: mem})
		if err != nil {
			t.Fatalf("fork (memory %v): %v", mem, err)
		}
		check("fork branch", res.Sandboxes[0].ID, want)
	}
	b, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "b", Volumes: atts[:1]})
	if err != nil {
		t.Fatal(err)
	}
	check("second sandbox", b.ID, want[:1])
	v, err := e.m.GetVolume(ctx, "data")
	if err != nil || len(v.Uses) != 4 {
		t.Fatalf("data's uses: %+v %v", v, err)
	}

	// Detach ref from a running sandbox: recorded now, applied at the next
	// start; until then ref counts as mounted.
	up, err := e.m.UpdateSandbox(ctx, "b", protocol.UpdateSandboxRequest{Volumes: &[]protocol.VolumeAttachment{{Name: "ref", MountPath: "/r"}}})
	if err != nil || len(up.Volumes) != 1 || up.Volumes[0].VolumeID != ref.ID {
		t.Fatalf("patch volumes: %+v %v", up, err)
	}
	check("running after a patch", b.ID, want[:1])
	if _, err := e.m.StopSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	check("restarted after a patch", b.ID, []runtime.Mount{{Source: e.storage.VolumePath(ref.ID), Target: "/r"}})

	// The record says what was attached at create and that a PATCH
	// changed it.
	evs := rec.Events(b.ID)
	created, _ := json.Marshal(evs[0].Data)
	if want := `"volumes":[{"name":"data","mount_path":"/data"}]`; !strings.Contains(string(created), want) {
		t.Fatalf("created event %s, want %s in it", created, want)
	}
	var changed bool
	for _, ev := range evs {
		d, _ := json.Marshal(ev.Data)
		changed = changed || ev.Type == protocol.EventPolicyChanged && strings.Contains(string(d), `"volumes"`)
	}
	if !changed {
		t.Fatal("no policy_changed event names volumes")
	}
}

// TestVolumeDeleteRefusedWhileInUse: a volume attached to a sandbox,
// running or stopped, or still mounted by a running one after a detach,
// is not deleted; once free it is, files and all. Its data outlives the
// sandboxes that used it.
func TestVolumeDeleteRefusedWhileInUse(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	v := e.createVolume(t, member, "data")
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "a", Volumes: []protocol.VolumeAttachment{{Name: "data", MountPath: "/data"}}}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.storage.VolumePath(v.ID), "kept"), "yes")
	if err := e.m.DeleteVolume(ctx, "data"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete while attached to a running sandbox: %v", err)
	}
	if _, err := e.m.StopSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.DeleteVolume(ctx, "data"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete while attached to a stopped sandbox: %v", err)
	}
	if _, err := e.m.StartSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "a", protocol.UpdateSandboxRequest{Volumes: &[]protocol.VolumeAttachment{}}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.DeleteVolume(ctx, "data"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete while a running instance still mounts it: %v", err)
	}
	if err := e.m.DeleteSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(e.storage.VolumePath(v.ID), "kept")); err != nil || string(b) != "yes" {
		t.Fatalf("volume data after its sandbox's deletion: %q %v", b, err)
	}
	if err := e.m.DeleteVolume(as(other), "data"); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("delete by a member who did not create it: %v", err)
	}
	if err := e.m.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.storage.VolumePath(v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("volume files after delete: %v", err)
	}
	if _, err := e.m.GetVolume(ctx, "data"); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
}

// TestVolumeValidation: every bad attachment or volume request is a field
// error naming the member, and leaves nothing behind.
func TestVolumeValidation(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	e.createVolume(t, member, "data")
	e.createVolume(t, member, "more")
	if err := e.st.EnsureWorkspace(ctx, store.Workspace{ID: "ws2", Name: "ws2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.CreateVolume(as(auth.Principal{WorkspaceID: "ws2", User: "dan", Role: store.RoleAdmin}),
		protocol.CreateVolumeRequest{Name: "theirs", SizeBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		atts  []protocol.VolumeAttachment
		field string
	}{
		{[]protocol.VolumeAttachment{{Name: "nope", MountPath: "/data"}}, "volumes[0].name"},
		{[]protocol.VolumeAttachment{{Name: "theirs", MountPath: "/data"}}, "volumes[0].name"},
		{[]protocol.VolumeAttachment{{MountPath: "/data"}}, "volumes[0].name"},
		{[]protocol.VolumeAttachment{{Name: "data", MountPath: "data"}}, "volumes[0].mount_path"},
		{[]protocol.VolumeAttachment{{Name: "data", MountPath: "/"}}, "volumes[0].mount_path"},
		{[]protocol.VolumeAttachment{{Name: "data", MountPath: "/a/../b"}}, "volumes[0].mount_path"},
		{[]protocol.VolumeAttachment{{Name: "data", MountPath: "/proc/x"}}, "volumes[0].mount_path"},
		{[]protocol.VolumeAttachment{{Name: "data", MountPath: "/data"}, {Name: "more", MountPath: "/data"}}, "volumes[1].mount_path"},
		{[]protocol.VolumeAttachment{{Name: "data", MountPath: "/data"}, {Name: "more", MountPath: "/data/sub"}}, "volumes[1].mount_path"},
		{[]protocol.VolumeAttachment{{Name: "data", MountPath: "/data"}, {Name: "nope", MountPath: "/x"}}, "volumes[1].name"},
		{make([]protocol.VolumeAttachment, MaxSandboxVolumes+1), "volumes"},
	} {
		if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "x", Volumes: c.atts}); fieldOf(err) != c.field {
			t.Errorf("create with %+v: %v, want a field error on %s", c.atts, err, c.field)
		}
	}
	if n := len(e.all(t)); n != 0 {
		t.Fatalf("%d sandboxes recorded by refused creates", n)
	}
	e.create(t, member, "y")
	if _, err := e.m.UpdateSandbox(ctx, "y", protocol.UpdateSandboxRequest{Volumes: &[]protocol.VolumeAttachment{{Name: "nope", MountPath: "/d"}}}); fieldOf(err) != "volumes[0].name" {
		t.Fatalf("patch with an unknown volume: %v", err)
	}
	for _, c := range []struct {
		req   protocol.CreateVolumeRequest
		field string
	}{
		{protocol.CreateVolumeRequest{Name: "bad name", SizeBytes: 1 << 20}, "name"},
		{protocol.CreateVolumeRequest{Name: "small", SizeBytes: 1}, "size_bytes"},
		{protocol.CreateVolumeRequest{Name: "none"}, "size_bytes"},
		{protocol.CreateVolumeRequest{Name: "huge", SizeBytes: DefaultLimits.MaxFSBytes + 1}, "size_bytes"},
		{protocol.CreateVolumeRequest{Name: "clone", FromSnapshot: "nope"}, "from_snapshot"},
	} {
		if _, err := e.m.CreateVolume(ctx, c.req); fieldOf(err) != c.field {
			t.Errorf("create volume %+v: %v, want a field error on %s", c.req, err, c.field)
		}
	}
	if _, err := e.m.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "data", SizeBytes: 1 << 20}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate volume name: %v", err)
	}
	e.storage.VolumeErr = errors.New("disk on fire")
	if _, err := e.m.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "broken", SizeBytes: 1 << 20}); err == nil {
		t.Fatal("a volume whose storage failed was created")
	}
	if list, err := e.m.ListVolumes(ctx); err != nil || len(list) != 2 {
		t.Fatalf("volumes after refused creates: %d %v", len(list), err)
	}
	ents, _ := os.ReadDir(filepath.Dir(e.storage.VolumePath("x")))
	if len(ents) != 3 {
		t.Fatalf("%d volume directories for 3 volumes", len(ents))
	}
}

// TestVolumeSnapshotAndClone: a snapshot keeps the volume's files as they
// were; a clone of it has them, takes the snapshot's size by default, and
// the snapshot outlives its volume.
func TestVolumeSnapshotAndClone(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	v := e.createVolume(t, member, "data")
	writeFile(t, filepath.Join(e.storage.VolumePath(v.ID), "f"), "one")
	vs, err := e.m.SnapshotVolume(ctx, "data", protocol.SnapshotVolumeRequest{Name: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.storage.VolumePath(v.ID), "f"), "two")
	if _, err := e.m.SnapshotVolume(ctx, "data", protocol.SnapshotVolumeRequest{Name: "s1"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate snapshot name: %v", err)
	}
	if err := e.m.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	c, err := e.m.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "copy", FromSnapshot: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if c.SizeBytes != v.SizeBytes || c.FromSnapshotID != vs.ID || e.storage.VolumeLimitOf(c.ID) != v.SizeBytes {
		t.Fatalf("clone: %+v (limit %d)", c.Volume, e.storage.VolumeLimitOf(c.ID))
	}
	if b, err := os.ReadFile(filepath.Join(e.storage.VolumePath(c.ID), "f")); err != nil || string(b) != "one" {
		t.Fatalf("clone's file: %q %v", b, err)
	}
	list, err := e.m.ListVolumeSnapshots(ctx)
	if err != nil || len(list) != 1 || list[0].VolumeName != "data" {
		t.Fatalf("snapshots: %+v %v", list, err)
	}
	if err := e.m.DeleteVolumeSnapshot(as(other), "s1"); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("delete another member's snapshot: %v", err)
	}
	if err := e.m.DeleteVolumeSnapshot(as(admin), "s1"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(e.storage.VolumePath(c.ID), "f")); err != nil || string(b) != "one" {
		t.Fatalf("clone's file after its snapshot's deletion: %q %v", b, err)
	}
}

// TestVolumeQuota: a volume's size counts as declared storage and a
// volume snapshot as a snapshot; past either quota the request is refused
// and nothing is made.
func TestVolumeQuota(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	if err := e.m.SetWorkspaceQuota(ctx, workspace, store.Quota{MaxStorageBytes: ptr(int64(100 << 20)), MaxSnapshots: ptr(int64(2))}); err != nil {
		t.Fatal(err)
	}
	e.createVolume(t, member, "a")
	var le *errdefs.LimitError
	if _, err := e.m.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "b", SizeBytes: 64 << 20}); !errors.As(err, &le) || le.Kind != errdefs.QuotaStorage {
		t.Fatalf("a volume past the storage quota: %v", err)
	}
	if _, err := e.m.SnapshotVolume(ctx, "a", protocol.SnapshotVolumeRequest{Name: "s"}); err != nil {
		t.Fatal(err) // the default snapshot is the first
	}
	if _, err := e.m.SnapshotVolume(ctx, "a", protocol.SnapshotVolumeRequest{Name: "t"}); !errors.As(err, &le) || le.Kind != errdefs.QuotaSnapshots {
		t.Fatalf("a volume snapshot past the snapshot quota: %v", err)
	}
	if list, _ := e.m.ListVolumes(ctx); len(list) != 1 {
		t.Fatalf("%d volumes after a refused create", len(list))
	}
	u, used, err := e.m.WorkspaceUsage(ctx, workspace)
	if err != nil || u.StorageBytes != 64<<20 || u.Snapshots != 2 || used < 2 {
		t.Fatalf("usage: %+v, %d bytes, %v", u, used, err)
	}
}

// TestVolumeLeftovers: volume and volume snapshot files no record has (a
// crash mid-create or mid-delete) are leftovers, moved aside by a clean
// (never deleted); recorded ones are not touched, and a restart's
// recovery cleans them.
func TestVolumeLeftovers(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	v := e.createVolume(t, member, "data")
	if _, err := e.m.SnapshotVolume(ctx, "data", protocol.SnapshotVolumeRequest{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.storage.VolumePath("stray"), "f"), "orphan")
	if _, err := e.storage.CreateVolume(ctx, "stray2", 1); err != nil {
		t.Fatal(err)
	}
	if err := e.storage.SnapshotVolume(ctx, "stray2", "straysnap"); err != nil {
		t.Fatal(err)
	}
	got, err := e.m.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []Leftover{{Kind: LeftoverVolume, ID: "stray"}, {Kind: LeftoverVolume, ID: "stray2"}, {Kind: LeftoverVolumeSnapshot, ID: "straysnap"}}
	if !slices.Equal(got, want) {
		t.Fatalf("leftovers %+v, want %+v", got, want)
	}
	e.reopen(t) // recovery cleans leftovers
	if got, err := e.m.Leftovers(ctx); err != nil || len(got) != 0 {
		t.Fatalf("leftovers after recovery: %+v %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(e.storage.Root, "orphans", "stray", "f")); err != nil || string(b) != "orphan" {
		t.Fatalf("a stray volume's files were not moved aside: %q %v", b, err)
	}
	if _, err := os.Stat(e.storage.VolumePath(v.ID)); err != nil {
		t.Fatalf("a recorded volume was touched: %v", err)
	}
}

// TestVolumesClearOfMounts: a volume attached where a data mount goes (or
// under or over one) is refused with the volume's field named.
func TestVolumesClearOfMounts(t *testing.T) {
	cfg := []string{"/data/repo"}
	for path, bad := range map[string]bool{"/data/repo": true, "/data": true, "/data/repo/x": true, "/data/other": false, "/srv": false} {
		err := volumesClearOfMounts([]store.VolumeAttachment{{VolumeID: "v", MountPath: "/ok"}, {VolumeID: "w", MountPath: path}}, cfg)
		if bad != (err != nil) || bad && !strings.Contains(err.Error(), "volumes[1].mount_path") {
			t.Errorf("volume at %s: %v", path, err)
		}
	}
	if err := volumesClearOfMounts([]store.VolumeAttachment{{VolumeID: "v", MountPath: "/data/repo"}}, nil); err != nil {
		t.Errorf("no mount_config: %v", err)
	}
}
