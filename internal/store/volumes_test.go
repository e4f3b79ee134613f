package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestVolumes checks volume records: unique names per workspace, scoping,
// attachments kept in order with the sandbox (create, replace, read back
// by every sandbox lookup, gone with the sandbox), a delete refused while
// attached, volume snapshots outliving their volume, and the quota usage
// they add.
func TestVolumes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, w := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, Workspace{ID: w, Name: w, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	vol := func(id, ws, name string) *Volume {
		return &Volume{ID: id, WorkspaceID: ws, CreatedBy: "u", Name: name, SizeBytes: 1 << 20, CreatedAt: now}
	}
	if err := st.CreateVolume(ctx, vol("v1", "w1", "data")); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateVolume(ctx, vol("v2", "w1", "cache")); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateVolume(ctx, vol("v3", "w1", "data")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	if err := st.CreateVolume(ctx, vol("v4", "w2", "data")); err != nil {
		t.Fatalf("same name in another workspace: %v", err)
	}
	if _, err := st.GetVolume(ctx, "w2", "cache"); !errdefs.IsNotFound(err) {
		t.Fatalf("another workspace's volume: %v", err)
	}
	if list, err := st.ListVolumes(ctx, "w1"); err != nil || len(list) != 2 || list[0].Name != "cache" {
		t.Fatalf("list: %v %v", list, err)
	}

	sb := &Sandbox{ID: "b1", WorkspaceID: "w1", CreatedBy: "u", Name: "box", Status: protocol.StatusReady, SnapshotID: "s",
		Runtime: "fake", VCPUs: 1, MemBytes: 1, FSCapacityBytes: 10, Token: "t", CreatedAt: now, UpdatedAt: now,
		Volumes: []VolumeAttachment{{VolumeID: "v1", MountPath: "/data"}, {VolumeID: "v2", MountPath: "/cache", ReadOnly: true}}}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	want := []VolumeAttachment{{VolumeID: "v1", VolumeName: "data", MountPath: "/data"}, {VolumeID: "v2", VolumeName: "cache", MountPath: "/cache", ReadOnly: true}}
	check := func(what string, got []VolumeAttachment, want []VolumeAttachment) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: attachments %+v, want %+v", what, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: attachments %+v, want %+v", what, got, want)
			}
		}
	}
	got, err := st.GetSandbox(ctx, "w1", "box")
	if err != nil {
		t.Fatal(err)
	}
	check("GetSandbox", got.Volumes, want)
	if got, err = st.GetSandboxByID(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	check("GetSandboxByID", got.Volumes, want)
	list, err := st.ListSandboxes(ctx, "w1", ListOptions{})
	if err != nil || len(list) != 1 {
		t.Fatalf("list sandboxes: %v %v", list, err)
	}
	check("ListSandboxes", list[0].Volumes, want)
	all, err := st.AllSandboxes(ctx)
	if err != nil || len(all) != 1 {
		t.Fatalf("all sandboxes: %v %v", all, err)
	}
	check("AllSandboxes", all[0].Volumes, want)
	// A sandbox created with an unknown (or since deleted) volume is not
	// recorded at all.
	bad := *sb
	bad.ID, bad.Name, bad.Volumes = "b2", "bad", []VolumeAttachment{{VolumeID: "nope", VolumeName: "nope", MountPath: "/x"}}
	if err := st.CreateSandbox(ctx, &bad); !errdefs.IsNotFound(err) {
		t.Fatalf("attach an unknown volume: %v", err)
	}
	if _, err := st.GetSandboxByID(ctx, "b2"); !errdefs.IsNotFound(err) {
		t.Fatalf("half-made sandbox recorded: %v", err)
	}

	uses, err := st.VolumeUses(ctx, "v1")
	if err != nil || len(uses) != 1 || uses[0] != (VolumeUse{SandboxID: "b1", SandboxName: "box", MountPath: "/data"}) {
		t.Fatalf("uses: %+v %v", uses, err)
	}
	if err := st.DeleteVolume(ctx, "w1", "v1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete an attached volume: %v", err)
	}
	if err := st.DeleteVolume(ctx, "w2", "v2"); !errdefs.IsNotFound(err) {
		t.Fatalf("delete through another workspace: %v", err)
	}
	u, err := st.WorkspaceUsage(ctx, "w1")
	if err != nil || u.StorageBytes != 10+2<<20 {
		t.Fatalf("usage with volumes: %+v %v", u, err)
	}

	// Replacing detaches v1; v2 stays attached.
	if err := st.SetSandboxVolumes(ctx, "b1", []VolumeAttachment{{VolumeID: "v2", MountPath: "/c2"}}); err != nil {
		t.Fatal(err)
	}
	if got, err = st.GetSandboxByID(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	check("after replace", got.Volumes, []VolumeAttachment{{VolumeID: "v2", VolumeName: "cache", MountPath: "/c2"}})
	if err := st.SetSandboxVolumes(ctx, "nosuch", nil); !errdefs.IsNotFound(err) {
		t.Fatalf("set volumes of an unknown sandbox: %v", err)
	}
	if err := st.DeleteVolume(ctx, "w1", "v1"); err != nil {
		t.Fatalf("delete a detached volume: %v", err)
	}
	// Deleting the sandbox drops its attachments.
	if err := st.DeleteSandbox(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	if uses, err := st.VolumeUses(ctx, "v2"); err != nil || len(uses) != 0 {
		t.Fatalf("uses after the sandbox's deletion: %+v %v", uses, err)
	}

	vs := &VolumeSnapshot{ID: "vs1", WorkspaceID: "w1", CreatedBy: "u", Name: "snap", VolumeID: "v2", VolumeName: "cache", SizeBytes: 1 << 20, CreatedAt: now}
	if err := st.CreateVolumeSnapshot(ctx, vs); err != nil {
		t.Fatal(err)
	}
	dup := *vs
	dup.ID = "vs2"
	if err := st.CreateVolumeSnapshot(ctx, &dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate snapshot name: %v", err)
	}
	if err := st.DeleteVolume(ctx, "w1", "v2"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	got2, err := st.GetVolumeSnapshot(ctx, "w1", "snap")
	if err != nil || *got2 != *vs {
		t.Fatalf("snapshot after its volume's deletion and a reopen: %+v %v", got2, err)
	}
	if u, err := st.WorkspaceUsage(ctx, "w1"); err != nil || u.Snapshots != 1 || u.StorageBytes != 0 {
		t.Fatalf("usage with a volume snapshot: %+v %v", u, err)
	}
	if err := st.DeleteWorkspace(ctx, "w1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete a workspace holding a volume snapshot: %v", err)
	}
	if err := st.DeleteVolumeSnapshot(ctx, "w1", "vs1"); err != nil {
		t.Fatal(err)
	}
	if list, err := st.ListVolumeSnapshots(ctx, "w1"); err != nil || len(list) != 0 {
		t.Fatalf("snapshots after delete: %v %v", list, err)
	}
}
