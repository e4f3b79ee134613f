package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func openTest(t *testing.T, path string) *SQLite {
	t.Helper()
	st, err := OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestRecordsSurviveReopen checks records, their JSON fields and the
// schema version persist across a close and reopen (a daemon restart).
func TestRecordsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC().Truncate(time.Millisecond)
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sn := &Snapshot{ID: "s1", WorkspaceID: "w", CreatedBy: "u", Name: "snap", Status: protocol.SnapshotReady,
		FSCapacityBytes: 1 << 30, Layers: []string{"/l/0", "/l/1"},
		RunConfig: protocol.RunConfig{User: "app", EnvVars: map[string]string{"A": "1"}}, CreatedAt: now, UpdatedAt: now}
	if err := st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	sb := &Sandbox{ID: "b1", WorkspaceID: "w", CreatedBy: "u", Name: "box", Status: protocol.StatusReady, SnapshotID: "s1",
		Runtime: "gvisor", VCPUs: 2, MemBytes: 1 << 30, Token: "tok", CreatedAt: now, UpdatedAt: now,
		RunConfig: &protocol.RunConfig{WorkDir: "/w"}}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st = openTest(t, path)
	gotSn, err := st.GetSnapshot(ctx, "w", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(gotSn.Layers) != 2 || gotSn.Layers[1] != "/l/1" || gotSn.RunConfig.User != "app" || gotSn.RunConfig.EnvVars["A"] != "1" {
		t.Fatalf("snapshot after reopen: %+v", gotSn)
	}
	gotSb, err := st.GetSandbox(ctx, "w", "box")
	if err != nil {
		t.Fatal(err)
	}
	if gotSb.ID != "b1" || gotSb.RunConfig == nil || gotSb.RunConfig.WorkDir != "/w" || gotSb.StoppedAt != nil || !gotSb.CreatedAt.Equal(now) {
		t.Fatalf("sandbox after reopen: %+v", gotSb)
	}
	if n, _ := st.CountSandboxesUsingSnapshot(ctx, "s1"); n != 1 {
		t.Fatalf("sandboxes using s1: %d", n)
	}
}

// TestNamesAndScoping checks unique names per workspace, workspace scoping
// and the typed errors the API maps to 404 and 409.
func TestNamesAndScoping(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now()
	for _, w := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, Workspace{ID: w, Name: w, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(id, ws, name string) error {
		return st.CreateSandbox(ctx, &Sandbox{ID: id, WorkspaceID: ws, CreatedBy: "u", Name: name, Status: protocol.StatusReady,
			SnapshotID: "s", Runtime: "namespace", Token: "t", CreatedAt: now, UpdatedAt: now})
	}
	if err := mk("a", "w1", "same"); err != nil {
		t.Fatal(err)
	}
	if err := mk("b", "w2", "same"); err != nil {
		t.Fatalf("same name in another workspace: %v", err)
	}
	if err := mk("c", "w1", "same"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate name: %v, want ErrConflict", err)
	}
	if _, err := st.GetSandbox(ctx, "w2", "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing sandbox: %v, want ErrNotFound", err)
	}
	got, err := st.GetSandbox(ctx, "w2", "same")
	if err != nil || got.ID != "b" {
		t.Fatalf("workspace scoping: %+v %v", got, err)
	}
	list, err := st.ListSandboxes(ctx, "w1", ListOptions{NameContains: "am", Limit: 10})
	if err != nil || len(list) != 1 || list[0].ID != "a" {
		t.Fatalf("list w1: %v %v", list, err)
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "k", WorkspaceID: "w1", User: "u", Role: RoleAdmin, Hash: "h", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "k2", WorkspaceID: "w1", User: "u", Role: RoleAdmin, Hash: "h", CreatedAt: now}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate key hash: %v", err)
	}
	if _, err := st.APIKeyByHash(ctx, "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
}

// The visibility filter applies before paging: a member's page is full of
// what it may see (its own, shared with it, shared with the workspace),
// and the next offset continues among those only.
func TestListSandboxesVisibleToPagesAfterFilter(t *testing.T) {
	st := openTest(t, filepath.Join(t.TempDir(), "db"))
	ctx := context.Background()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC().Add(-time.Hour)
	want := map[string]bool{}
	for i := range 30 {
		who := "a"
		if i%3 == 0 {
			who = "b"
		}
		sb := &Sandbox{ID: fmt.Sprintf("id-%02d", i), WorkspaceID: "w", CreatedBy: who, Name: fmt.Sprintf("n-%02d", i),
			Status: "stopped", Token: "t", CreatedAt: base.Add(time.Duration(i) * time.Second), UpdatedAt: base}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		grantee := map[int]string{4: "b", 5: ShareWorkspace, 7: "c"}[i]
		if grantee != "" {
			putShare(t, st, ShareSandbox, sb.ID, grantee, "read")
		}
		if who == "b" || grantee == "b" || grantee == ShareWorkspace {
			want[sb.Name] = true
		}
	}
	var seen []string
	for off := 0; ; off += 4 {
		page, err := st.ListSandboxes(ctx, "w", ListOptions{VisibleTo: "b", Limit: 4, Offset: off})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page {
			if !want[sb.Name] {
				t.Fatalf("filter let %s's %s through", sb.CreatedBy, sb.Name)
			}
			seen = append(seen, sb.Name)
		}
		if len(page) < 4 {
			break
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("paged through %d of b's %d sandboxes: %v", len(seen), len(want), seen)
	}
}

func putShare(t *testing.T, st *SQLite, kind, id, grantee, access string) *Share {
	t.Helper()
	sh := &Share{ID: "sh-" + kind + id + grantee, WorkspaceID: "w", ResourceKind: kind, ResourceID: id, Grantee: grantee,
		Access: access, CreatedBy: "a", CreatedAt: time.Now()}
	if err := st.PutShare(context.Background(), sh); err != nil {
		t.Fatal(err)
	}
	return sh
}

// TestShares: a second grant to a grantee changes its access (same share),
// the best of a user's and the workspace's grant wins, revocation and the
// resource's deletion remove shares, and image-built snapshots are listed
// to every member.
func TestShares(t *testing.T) {
	st := openTest(t, filepath.Join(t.TempDir(), "db"))
	ctx := context.Background()
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, &Sandbox{ID: "b1", WorkspaceID: "w", CreatedBy: "a", Name: "box", Status: "stopped", Token: "t", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	first := putShare(t, st, ShareSandbox, "b1", "u", "read")
	again := &Share{ID: "other", WorkspaceID: "w", ResourceKind: ShareSandbox, ResourceID: "b1", Grantee: "u", Access: "use", CreatedBy: "a", CreatedAt: now}
	if err := st.PutShare(ctx, again); err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID || again.Access != "use" {
		t.Fatalf("second grant: %+v, want share %s with use", again, first.ID)
	}
	access := func(user string) string {
		t.Helper()
		a, err := st.SharedAccess(ctx, ShareSandbox, "b1", user)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	ws := putShare(t, st, ShareSandbox, "b1", ShareWorkspace, "read")
	if got := access("u"); got != "use" {
		t.Fatalf("u has %q, want use (its own grant beats the workspace's read)", got)
	}
	if got := access("v"); got != "read" {
		t.Fatalf("v has %q, want read through the workspace", got)
	}
	if list, err := st.ListShares(ctx, ShareSandbox, "b1"); err != nil || len(list) != 2 {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := st.DeleteShare(ctx, ShareSandbox, "b1", ws.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DeleteShare(ctx, ShareSandbox, "b1", ws.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if got := access("v"); got != "" {
		t.Fatalf("v has %q after revocation", got)
	}
	if err := st.DeleteSandbox(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	if list, _ := st.ListShares(ctx, ShareSandbox, "b1"); len(list) != 0 {
		t.Fatalf("shares outlived their sandbox: %v", list)
	}

	for _, sn := range []*Snapshot{
		{ID: "img", WorkspaceID: "w", CreatedBy: "a", Name: "img", Status: "ready", CreatedAt: now, UpdatedAt: now},
		{ID: "cap", WorkspaceID: "w", CreatedBy: "a", Name: "cap", Status: "ready", SourceSandboxID: "b1", CreatedAt: now.Add(time.Second), UpdatedAt: now},
	} {
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if list, _ := st.ListSnapshots(ctx, "w", ListOptions{VisibleTo: "u"}); len(list) != 0 {
		t.Fatalf("u lists %v, want none: snapshots are private until shared", list)
	}
	putShare(t, st, ShareSnapshot, "cap", "u", "read")
	putShare(t, st, ShareSnapshot, "img", ShareWorkspace, "use")
	if list, _ := st.ListSnapshots(ctx, "w", ListOptions{VisibleTo: "u"}); len(list) != 2 {
		t.Fatalf("u lists %d snapshots after two shares, want 2", len(list))
	}
	if err := st.DeleteSnapshot(ctx, "w", "cap"); err != nil {
		t.Fatal(err)
	}
	if list, _ := st.ListShares(ctx, ShareSnapshot, "cap"); len(list) != 0 {
		t.Fatalf("shares outlived their snapshot: %v", list)
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "k", WorkspaceID: "w", User: "u", Role: RoleMember, Hash: "h", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string]bool{"u": true, "nobody": false} {
		if got, err := st.UserInWorkspace(ctx, "w", user); err != nil || got != want {
			t.Fatalf("UserInWorkspace(%s) = %v %v", user, got, err)
		}
	}
}

// TestPreserveMemoryOnStopPersists checks the flag is stored on create,
// rewritten by UpdateSandbox and read back after a reopen.
func TestPreserveMemoryOnStopPersists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sb := &Sandbox{ID: "b1", WorkspaceID: "w", CreatedBy: "u", Name: "box", Status: protocol.StatusReady,
		Token: "tok", CreatedAt: now, UpdatedAt: now, PreserveMemoryOnStop: true}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetSandboxByID(ctx, "b1"); err != nil || !got.PreserveMemoryOnStop {
		t.Fatalf("after create: %+v, %v", got, err)
	}
	sb.PreserveMemoryOnStop = false
	if err := st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	if got, err := st.GetSandboxByID(ctx, "b1"); err != nil || got.PreserveMemoryOnStop {
		t.Fatalf("after update and reopen: %+v, %v", got, err)
	}
}

// TestDockerOptInPersists: a sandbox's and a snapshot's docker flag are
// stored on create and read back, in a get and a list.
func TestDockerOptInPersists(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, sn := range []*Snapshot{
		{ID: "s1", WorkspaceID: "w", Name: "with", Status: protocol.SnapshotReady, CreatedAt: now, UpdatedAt: now, Docker: true},
		{ID: "s2", WorkspaceID: "w", Name: "without", Status: protocol.SnapshotReady, CreatedAt: now, UpdatedAt: now},
	} {
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := st.GetSnapshot(ctx, "w", "s1"); err != nil || !got.Docker {
		t.Fatalf("snapshot with docker: %+v, %v", got, err)
	}
	list, err := st.ListSnapshots(ctx, "w", ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range list {
		if sn.Docker != (sn.ID == "s1") {
			t.Errorf("listed snapshot %s has docker %v", sn.ID, sn.Docker)
		}
	}
	sb := &Sandbox{ID: "b1", WorkspaceID: "w", CreatedBy: "u", Name: "box", Status: protocol.StatusReady,
		Token: "tok", CreatedAt: now, UpdatedAt: now, Docker: true}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetSandboxByID(ctx, "b1"); err != nil || !got.Docker {
		t.Fatalf("sandbox with docker: %+v, %v", got, err)
	}
}

// TestPingReportsAHeldWriteLock: the health probe fails while another
// process holds the database's write lock, and passes once it is released.
func TestPingReportsAHeldWriteLock(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st, other := openTest(t, path), openTest(t, path)
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("ping of a healthy database: %v", err)
	}
	conn, err := other.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := st.Ping(short); err == nil {
		t.Fatal("ping passed while another connection held the write lock")
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("ping after the lock was released: %v", err)
	}
}

// TestBuildCache checks the step cache: get marks use (LRU order), a put
// under a taken key retires the old entry rather than losing its layer,
// and delete removes one entry of one workspace.
func TestBuildCache(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	old := time.Now().Add(-time.Hour)
	for i, k := range []string{"k1", "k2"} {
		e := &BuildCacheEntry{WorkspaceID: "w", Key: k, LayerID: "l" + k, Layer: "/c/" + k, SizeBytes: int64(i + 1), CreatedAt: old, UsedAt: old.Add(time.Duration(i) * time.Second)}
		if err := st.PutBuildCache(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.GetBuildCache(ctx, "other", "k1"); !errdefs.IsNotFound(err) {
		t.Fatalf("another workspace's entry: %v", err)
	}
	e, err := st.GetBuildCache(ctx, "w", "k1")
	if err != nil || e.Layer != "/c/k1" || e.LayerID != "lk1" || e.SizeBytes != 1 {
		t.Fatalf("get k1 = %+v, %v", e, err)
	}
	list, err := st.ListBuildCache(ctx, "w")
	if err != nil || len(list) != 2 || list[0].Key != "k2" || list[1].Key != "k1" {
		t.Fatalf("LRU order after using k1: %+v %v", list, err)
	}
	if err := st.PutBuildCache(ctx, &BuildCacheEntry{WorkspaceID: "w", Key: "k1", LayerID: "new", Layer: "/c/new", CreatedAt: old, UsedAt: old}); err != nil {
		t.Fatal(err)
	}
	if e, err := st.GetBuildCache(ctx, "w", "k1"); err != nil || e.LayerID != "new" {
		t.Fatalf("k1 after replace = %+v, %v", e, err)
	}
	if e, err := st.GetBuildCache(ctx, "w", "retired/lk1"); err != nil || e.Layer != "/c/k1" {
		t.Fatalf("retired entry = %+v, %v", e, err)
	}
	if err := st.DeleteBuildCache(ctx, "w", "k2"); err != nil {
		t.Fatal(err)
	}
	if list, _ := st.ListBuildCache(ctx, "w"); len(list) != 2 {
		t.Fatalf("after delete: %d entries", len(list))
	}
}

// TestUpdateSnapshotBuildResult checks an update records what a
// Dockerfile build learns only at its end: the base image, the labels and
// the start command.
func TestUpdateSnapshotBuildResult(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	sn := &Snapshot{ID: "s1", WorkspaceID: "w", CreatedBy: "u", Name: "app", Status: protocol.SnapshotBuilding, CreatedAt: time.Now(), UpdatedAt: time.Now()}
	if err := st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	sn.Status, sn.DockerImage, sn.Labels, sn.Layers = protocol.SnapshotReady, "busybox", map[string]string{"team": "core"}, []string{"/l"}
	sn.StartCmd, sn.ReadyCmd = "exec server", "test -e /ready"
	if err := st.UpdateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetSnapshot(ctx, "w", "s1")
	if err != nil || got.DockerImage != "busybox" || got.Labels["team"] != "core" || got.Status != protocol.SnapshotReady ||
		got.StartCmd != "exec server" || got.ReadyCmd != "test -e /ready" {
		t.Fatalf("after update: %+v, %v", got, err)
	}
}

// TestLayerOwners: snapshot ids, build-cache layer ids and sandbox ids,
// of every workspace, own layers; nothing else does.
func TestLayerOwners(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC()
	for _, ws := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, Workspace{ID: ws, Name: ws, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateSnapshot(ctx, &Snapshot{ID: "snap1", WorkspaceID: "w1", Name: "a", Status: protocol.SnapshotReady, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, &Sandbox{ID: "sb1", WorkspaceID: "w2", Name: "b", Status: protocol.StatusReady, SnapshotID: "snap1", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutBuildCache(ctx, &BuildCacheEntry{WorkspaceID: "w2", Key: "k", LayerID: "layer1", Layer: "/l", CreatedAt: now, UsedAt: now}); err != nil {
		t.Fatal(err)
	}
	got, err := st.LayerOwners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !got["snap1"] || !got["sb1"] || !got["layer1"] {
		t.Fatalf("owners %v", got)
	}
}

// TestMountConfigPersists: a sandbox's mount_config is stored at create
// and survives updates and a reopen; none reads back as nil.
func TestMountConfigPersists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	cfg := `{"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r"}}]}`
	for _, sb := range []*Sandbox{
		{ID: "b1", WorkspaceID: "w", CreatedBy: "u", Name: "box", Status: protocol.StatusReady, Token: "t", CreatedAt: now, UpdatedAt: now, MountConfig: []byte(cfg)},
		{ID: "b2", WorkspaceID: "w", CreatedBy: "u", Name: "box2", Status: protocol.StatusReady, Token: "t", CreatedAt: now, UpdatedAt: now},
	} {
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	sb, _ := st.GetSandboxByID(ctx, "b1")
	sb.Status = protocol.StatusStopped
	if err := st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	if got, err := st.GetSandboxByID(ctx, "b1"); err != nil || string(got.MountConfig) != cfg {
		t.Fatalf("b1 after update and reopen: %q, %v", got.MountConfig, err)
	}
	if got, err := st.GetSandboxByID(ctx, "b2"); err != nil || got.MountConfig != nil {
		t.Fatalf("b2: %q, %v", got.MountConfig, err)
	}
}

// Pools and pool instances are replaced, removed at size 0 and survive a
// reopen (the daemon's restart finds its predecessor's instances).
func TestPoolsAndInstances(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db")
	st := openTest(t, path)
	if err := st.PutPool(ctx, Pool{SnapshotID: "s1", WorkspaceID: "w", Size: 3, MaxAgeSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutPool(ctx, Pool{SnapshotID: "s1", WorkspaceID: "w", Size: 5}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutPool(ctx, Pool{SnapshotID: "s2", Size: 1}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutPool(ctx, Pool{SnapshotID: "s2"}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	for _, id := range []string{"i1", "i2"} {
		if err := st.AddPoolInstance(ctx, PoolInstance{ID: id, SnapshotID: "s1", CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DeletePoolInstance(ctx, "i1"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	pools, err := st.ListPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Pool{{SnapshotID: "s1", WorkspaceID: "w", Size: 5}}; !reflect.DeepEqual(pools, want) {
		t.Fatalf("pools %+v, want %+v", pools, want)
	}
	inst, err := st.ListPoolInstances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(inst) != 1 || inst[0].ID != "i2" || inst[0].SnapshotID != "s1" || !inst[0].CreatedAt.Equal(at) {
		t.Fatalf("instances %+v", inst)
	}
}
