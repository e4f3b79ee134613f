package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/go-containerregistry/pkg/authn"
)

// noImages fails every image pull: snapshot builds end failed, but the
// create answers first.
type noImages struct{}

func (noImages) Resolve(context.Context, string, string, authn.Authenticator, func(image.Progress)) (*image.Image, error) {
	return nil, fmt.Errorf("no registry in this test: %w", errdefs.ErrNotFound)
}

func (noImages) LoadReader(context.Context, string, io.Reader, string) ([]*image.Image, error) {
	return nil, fmt.Errorf("no image archives in this test: %w", errdefs.ErrInvalid)
}

// realAPI is the API over a real manager (the sandboxtest fakes below
// it) and a real store, with workspace w1 holding a ready "default".
type realAPI struct {
	*testAPI
	st *store.SQLite
}

func newRealAPI(t *testing.T) *realAPI {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.EnsureWorkspace(ctx, store.Workspace{ID: "w1", Name: "w1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(dir, "layer0")
	if err := os.MkdirAll(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if err := st.CreateSnapshot(ctx, &store.Snapshot{ID: "snap-default", WorkspaceID: "w1", CreatedBy: "ann", Name: "default",
		Status: protocol.SnapshotReady, Layers: []string{layer}, FSCapacityBytes: 1 << 30, CreatedAt: now, UpdatedAt: now,
		Labels: map[string]string{"base": "yes"}}); err != nil {
		t.Fatal(err)
	}
	// Shared with the workspace, as an admin would: snapshots are private.
	if err := st.PutShare(ctx, &store.Share{ID: "share-default", WorkspaceID: "w1", ResourceKind: store.ShareSnapshot,
		ResourceID: "snap-default", Grantee: store.ShareWorkspace, Access: "use", CreatedBy: "ann", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	drv, err := sandboxtest.NewDriver()
	if err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{Store: st, Storage: sandboxtest.NewStorage(filepath.Join(dir, "storage")), Network: sandboxtest.NewNetwork(),
		Drivers: []runtime.Driver{drv}, AgentPort: drv.AgentPort, Images: noImages{}, Logger: slog.New(slog.DiscardHandler),
		TTLGranularity: time.Second, ReapInterval: time.Hour, Limits: sandbox.DefaultLimits}
	mgr, err := sandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mgr.Close()
		all, _ := st.AllSandboxes(ctx)
		for _, sb := range all {
			drv.Stop(ctx, "cubicle-"+sb.ID)
		}
		st.Close()
	})
	ta := &testAPI{images: &fakeImages{}}
	ta.srv = New(mgr, fakeAuth{}, ta.images, "http://api.test", slog.New(slog.DiscardHandler))
	return &realAPI{testAPI: ta, st: st}
}

// at reads a dotted path of a decoded JSON body.
func at(body any, path string) any {
	for _, k := range strings.Split(path, ".") {
		m, _ := body.(map[string]any)
		body = m[k]
	}
	return body
}

// memberCase sends one client member and says what honouring it looks
// like in the answer; refused, it must be a 422 naming the member.
type memberCase struct {
	member       string
	method, path string
	body         any
	honoured     func(body any) bool
}

// conflicts are the members a request may also be refused for with a
// 409 naming them: restore_memory: true when there is no memory image.
var conflicts = map[string]bool{"restore_memory": true}

// eq is a check that the answer's path holds want (an int as JSON
// decodes it).
func eq(path string, want any) func(any) bool {
	if n, ok := want.(int); ok {
		want = float64(n)
	}
	return func(b any) bool { return fmt.Sprint(at(b, path)) == fmt.Sprint(want) }
}

// TestClientMembersHonouredOrRefused sends every member the official
// clients send on create, update, capture, snapshot create and the lists
// (npm langsmith 0.12's types.d.ts and the Python client's OpenAPI
// params), one at a time, and checks each is honoured (reflected in the
// answer) or refused with a 422 naming it — none accepted and dropped.
// proxy_config (enforced by the egress proxy, not echoed) is covered by
// the egress tests; access_delegation is checked but, with no control-
// plane credential in a sandbox, not echoed either.
func TestClientMembersHonouredOrRefused(t *testing.T) {
	ra := newRealAPI(t)
	const boxes, snaps = v2 + "/boxes", v2 + "/snapshots"
	mk := func(name string, extra map[string]any) map[string]any {
		b := map[string]any{"name": name}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	if st, b := ra.do(t, "POST", boxes, memberKey, mk("box", map[string]any{"labels": map[string]string{"team": "x"}})); st != 201 {
		t.Fatalf("create box: %d %v", st, b)
	}
	refused := func(b any) bool { return false }
	cases := []memberCase{
		// POST /boxes (CreateSandboxOptions and BoxCreateParams).
		{"persistent", "POST", boxes, mk("c-persistent", map[string]any{"persistent": false}), eq("persistent", false)},
		{"preserve_memory_on_stop", "POST", boxes, mk("c-pmos", map[string]any{"preserve_memory_on_stop": true}), eq("preserve_memory_on_stop", true)},
		{"restore_memory", "POST", boxes, mk("c-rm", map[string]any{"restore_memory": true}), refused},
		{"snapshot_id", "POST", boxes, mk("c-sid", map[string]any{"snapshot_id": "snap-default"}), eq("snapshot_id", "snap-default")},
		{"snapshot_name", "POST", boxes, mk("c-sname", map[string]any{"snapshot_name": "default"}), eq("snapshot_id", "snap-default")},
		{"snapshot", "POST", boxes, mk("c-snap", map[string]any{"snapshot": "default:latest"}), eq("snapshot_id", "snap-default")},
		{"name", "POST", boxes, mk("c-name", nil), eq("name", "c-name")},
		{"wait_for_ready", "POST", boxes, mk("c-wait", map[string]any{"wait_for_ready": false}), eq("status", "provisioning")},
		{"timeout", "POST", boxes, mk("c-timeout", map[string]any{"timeout": 30}), eq("status", "ready")},
		{"idle_ttl_seconds", "POST", boxes, mk("c-ttl", map[string]any{"idle_ttl_seconds": 120}), eq("idle_ttl_seconds", 120)},
		{"delete_after_stop_seconds", "POST", boxes, mk("c-das", map[string]any{"delete_after_stop_seconds": 180}), eq("delete_after_stop_seconds", 180)},
		{"vcpus", "POST", boxes, mk("c-vcpus", map[string]any{"vcpus": 3}), eq("cpu_millicores", 3000)},
		{"cpu_millicores", "POST", boxes, mk("c-milli", map[string]any{"cpu_millicores": 1500}), func(b any) bool {
			return eq("cpu_millicores", 1500)(b) && eq("vcpus", 2)(b)
		}},
		{"cpu_millicores", "POST", boxes, mk("c-milli2", map[string]any{"cpu_millicores": 1500, "vcpus": 1}), refused},
		{"mem_bytes", "POST", boxes, mk("c-mem", map[string]any{"mem_bytes": 512 << 20}), eq("mem_bytes", 512<<20)},
		{"fs_capacity_bytes", "POST", boxes, mk("c-fs", map[string]any{"fs_capacity_bytes": 2 << 30}), eq("fs_capacity_bytes", 2<<30)},
		{"labels", "POST", boxes, mk("c-labels", map[string]any{"labels": map[string]string{"team": "y"}}), func(b any) bool {
			return eq("labels.team", "y")(b) && eq("labels.base", "yes")(b) // the snapshot's inherited
		}},
		{"labels", "POST", boxes, mk("c-labels2", map[string]any{"labels": map[string]string{"bad key": "y"}}), refused},
		{"env_vars", "POST", boxes, mk("c-env", map[string]any{"env_vars": map[string]string{"B": "2"}}), eq("run_config.env_vars.B", "2")},
		{"env_vars", "POST", boxes, mk("c-env2", map[string]any{"env_vars": map[string]string{"B": "2"}, "run_config": map[string]any{"env_vars": map[string]string{"B": "3"}}}), refused},
		{"run_config", "POST", boxes, mk("c-rc", map[string]any{"run_config": map[string]any{"env_vars": map[string]string{"A": "1"}}}), eq("run_config.env_vars.A", "1")},
		{"mount_config", "POST", boxes, mk("c-mount", map[string]any{"mount_config": map[string]any{"mounts": []any{map[string]any{"id": "m", "type": "git"}}}}), refused},
		{"tag_value_ids", "POST", boxes, mk("c-tags", map[string]any{"tag_value_ids": []string{"t"}}), refused},
		{"size_class", "POST", boxes, mk("c-unknown", map[string]any{"size_class": "xl"}), refused},
		{"runtime", "POST", boxes, mk("c-rt", map[string]any{"runtime": "fake"}), eq("runtime", "fake")},
		{"runtime", "POST", boxes, mk("c-rt2", map[string]any{"runtime": "microvm"}), refused},
		// PATCH /boxes/{name} (UpdateSandboxOptions and BoxUpdateParams).
		{"idle_ttl_seconds", "PATCH", boxes + "/box", map[string]any{"idle_ttl_seconds": 300}, eq("idle_ttl_seconds", 300)},
		{"delete_after_stop_seconds", "PATCH", boxes + "/box", map[string]any{"delete_after_stop_seconds": 240}, eq("delete_after_stop_seconds", 240)},
		{"run_config", "PATCH", boxes + "/box", map[string]any{"run_config": map[string]any{"work_dir": "/srv"}}, eq("run_config.work_dir", "/srv")},
		{"cpu_millicores", "PATCH", boxes + "/box", map[string]any{"cpu_millicores": 2500}, func(b any) bool {
			return eq("cpu_millicores", 2500)(b) && eq("vcpus", 3)(b)
		}},
		{"vcpus", "PATCH", boxes + "/box", map[string]any{"vcpus": 1}, eq("cpu_millicores", 1000)},
		{"mem_bytes", "PATCH", boxes + "/box", map[string]any{"mem_bytes": 256 << 20}, eq("mem_bytes", 256<<20)},
		{"fs_capacity_bytes", "PATCH", boxes + "/box", map[string]any{"fs_capacity_bytes": 3 << 30}, eq("fs_capacity_bytes", 3<<30)},
		{"labels", "PATCH", boxes + "/box", map[string]any{"labels": map[string]string{"team": "x", "tier": "1"}}, eq("labels.tier", "1")},
		{"tag_value_ids", "PATCH", boxes + "/box", map[string]any{"tag_value_ids": []string{"t"}}, refused},
		{"preserve_memory_on_stop", "PATCH", boxes + "/box", map[string]any{"preserve_memory_on_stop": true}, eq("preserve_memory_on_stop", true)},
		{"preserve_memory_on_stop", "PATCH", boxes + "/c-persistent", map[string]any{"preserve_memory_on_stop": true}, refused},
		{"name", "PATCH", boxes + "/c-name", map[string]any{"name": "c-renamed"}, eq("name", "c-renamed")},
		// POST /boxes/{name}/snapshot (CaptureSnapshotOptions, BoxCreateSnapshotParams).
		{"tag", "POST", boxes + "/box/snapshot", map[string]any{"name": "cap", "tag": "v2"}, eq("tag", "v2")},
		{"labels", "POST", boxes + "/box/snapshot", map[string]any{"name": "cap", "tag": "v3", "labels": map[string]string{"l": "1"}}, func(b any) bool {
			return eq("labels.l", "1")(b) && eq("labels.team", "x")(b) // seeded over the sandbox's
		}},
		{"fs_capacity_bytes", "POST", boxes + "/box/snapshot", map[string]any{"name": "cap-fs", "fs_capacity_bytes": 4 << 30}, eq("fs_capacity_bytes", 4<<30)},
		{"run_config", "POST", boxes + "/box/snapshot", map[string]any{"name": "cap-rc", "run_config": map[string]any{"user": "app"}}, eq("run_config.user", "app")},
		{"docker_image", "POST", boxes + "/box/snapshot", map[string]any{"name": "cap-di", "docker_image": "x:1"}, func(b any) bool {
			return eq("status", "building")(b) && eq("docker_image", "x:1")(b) // exported from the sandbox's Docker
		}},
		{"checkpoint", "POST", boxes + "/box/snapshot", map[string]any{"name": "cap-cp", "checkpoint": "ck-1"}, refused},
		// POST /snapshots (CreateSnapshotOptions, SnapshotCreateParams).
		{"tag", "POST", snaps, map[string]any{"name": "img", "docker_image": "alpine:3", "fs_capacity_bytes": 1 << 30, "tag": "v1"}, eq("tag", "v1")},
		{"labels", "POST", snaps, map[string]any{"name": "img", "docker_image": "alpine:3", "fs_capacity_bytes": 1 << 30, "labels": map[string]string{"k": "v"}}, eq("labels.k", "v")},
		{"run_config", "POST", snaps, map[string]any{"name": "img", "docker_image": "alpine:3", "fs_capacity_bytes": 1 << 30, "run_config": map[string]any{"user": "1"}}, eq("run_config.user", "1")},
		{"registry_id", "POST", snaps, map[string]any{"name": "img", "docker_image": "alpine:3", "fs_capacity_bytes": 1 << 30, "registry_id": "r"}, refused},
		// GET /boxes and /snapshots (BoxListParams, SnapshotListParams).
		{"label", "GET", boxes + "?label=team=x", nil, func(b any) bool { return allItems(b, "labels.team", "x", 1) }},
		{"label", "GET", boxes + "?label=team&label=tier=1", nil, func(b any) bool { return allItems(b, "name", "box", 1) }},
		{"page_size", "GET", boxes + "?page_size=2", nil, func(b any) bool { return len(items(b)) == 2 && at(b, "next_cursor") != nil }},
		{"sort_by", "GET", boxes + "?sort_by=name&sort_order=desc&page_size=1", nil, func(b any) bool { return allItems(b, "name", "c-wait", 1) }},
		{"created_by", "GET", boxes + "?created_by=me", nil, func(b any) bool { return allItems(b, "created_by", "bob", 2) }},
		{"created_by", "GET", boxes + "?created_by=ann", nil, func(b any) bool { return len(items(b)) == 0 && at(b, "items") != nil }},
		{"status", "GET", boxes + "?status=provisioning&status=ready", nil, func(b any) bool { return allItems(b, "status", "provisioning", 0) }},
		{"status", "GET", boxes + "?status=sleeping", nil, refused},
		{"cursor", "GET", boxes + "?cursor=bogus", nil, refused},
		{"sort_direction", "GET", snaps + "?sort_direction=desc&page_size=1", nil, func(b any) bool { return len(items(b)) == 1 }},
		{"name_contains", "GET", snaps + "?name_contains=defa", nil, func(b any) bool { return allItems(b, "name", "default", 1) }},
		{"label", "GET", snaps + "?label=base=yes", nil, func(b any) bool { return allItems(b, "name", "default", 1) }},
		{"offset", "GET", snaps + "?offset=1&limit=1", nil, func(b any) bool { return len(items(b)) == 1 && at(b, "next_cursor") == "2" }},
		{"tag_value_id", "GET", snaps + "?tag_value_id=x", nil, refused},
	}
	for _, c := range cases {
		st, b := ra.do(t, c.method, c.path, memberKey, c.body)
		loc, _ := validation(b)
		switch {
		case st == 422:
			if loc != "body/"+c.member && !strings.HasPrefix(loc, "body/"+c.member+".") {
				t.Errorf("%s %s %v: 422 naming %q, not %s", c.method, c.path, c.body, loc, c.member)
			}
		case st == 409 && conflicts[c.member] && strings.Contains(fmt.Sprint(b), c.member):
		case st/100 == 2 && c.honoured(b):
		default:
			t.Errorf("%s %s %v: %d %v: %s neither honoured nor refused", c.method, c.path, c.body, st, b, c.member)
		}
	}
}

func items(b any) []any {
	v, _ := at(b, "items").([]any)
	return v
}

// allItems reports whether b lists at least n items and each has want at
// path.
func allItems(b any, path string, want any, n int) bool {
	list := items(b)
	for _, it := range list {
		if fmt.Sprint(at(it, path)) != fmt.Sprint(want) {
			return false
		}
	}
	return len(list) >= n && at(b, "items") != nil
}

// TestSnapshotRefsAndCursorPaging: a captured name:tag is listed under
// its name, got by reference and boots a sandbox that inherits its labels;
// keyset cursors walk a sorted list once.
func TestSnapshotRefsAndCursorPaging(t *testing.T) {
	ra := newRealAPI(t)
	const boxes = v2 + "/boxes"
	for i := range 5 {
		body := map[string]any{"name": fmt.Sprintf("b%d", i), "labels": map[string]string{"i": fmt.Sprint(i)}}
		if st, b := ra.do(t, "POST", boxes, memberKey, body); st != 201 {
			t.Fatalf("create: %d %v", st, b)
		}
	}
	capture := func(tag string) string {
		st, b := ra.do(t, "POST", boxes+"/b1/snapshot", memberKey, map[string]any{"name": "cap", "tag": tag})
		if st != 201 {
			t.Fatalf("capture %s: %d %v", tag, st, b)
		}
		return fmt.Sprint(at(b, "id"))
	}
	v1, latest := capture("v1"), capture("")
	st, b := ra.do(t, "GET", v2+"/snapshots-by-name/cap", memberKey, nil)
	if st != 200 || at(b, "name") != "cap" || fmt.Sprint(at(b, "tags")) != fmt.Sprintf("[map[snapshot_id:%s tag:v1] map[snapshot_id:%s tag:latest]]", v1, latest) {
		t.Fatalf("tags of cap: %d %v", st, b)
	}
	if st, _ := ra.do(t, "GET", v2+"/snapshots-by-name/nothing", memberKey, nil); st != 404 {
		t.Fatalf("tags of an unknown name: %d", st)
	}
	for ref, want := range map[string]string{"cap:v1": v1, "cap": latest, "cap:latest": latest} {
		if st, b := ra.do(t, "GET", v2+"/snapshots/"+url.PathEscape(ref), memberKey, nil); st != 200 || at(b, "id") != want {
			t.Errorf("GET snapshot %s: %d %v, want %s", ref, st, b, want)
		}
	}
	st, b = ra.do(t, "POST", boxes, memberKey, map[string]any{"name": "from-tag", "snapshot": "cap:v1", "labels": map[string]string{"own": "1"}})
	if st != 201 || at(b, "snapshot_id") != v1 || at(b, "labels.i") != "1" || at(b, "labels.own") != "1" {
		t.Fatalf("create from cap:v1: %d %v", st, b)
	}
	var names []string
	next := ""
	for range 10 {
		q := "?page_size=2&sort_by=name&sort_order=desc"
		if next != "" {
			q += "&cursor=" + url.QueryEscape(next)
		}
		st, b := ra.do(t, "GET", boxes+q, memberKey, nil)
		if st != 200 {
			t.Fatalf("page: %d %v", st, b)
		}
		for _, it := range items(b) {
			names = append(names, fmt.Sprint(at(it, "name")))
		}
		if at(b, "next_cursor") == nil {
			break
		}
		next = fmt.Sprint(at(b, "next_cursor"))
		if !strings.HasPrefix(next, "k1.") {
			t.Fatalf("cursor paging answered next_cursor %q, want an opaque cursor", next)
		}
	}
	if got := strings.Join(names, ","); got != "from-tag,b4,b3,b2,b1,b0" {
		t.Fatalf("walked %s", got)
	}
	if st, b := ra.do(t, "GET", boxes+"?page_size=2&sort_by=created_at&cursor="+url.QueryEscape(next), memberKey, nil); st != 422 {
		t.Fatalf("cursor of another sort: %d %v", st, b)
	}
	if st, b := ra.do(t, "GET", boxes+"?page_size=2&cursor=2", memberKey, nil); st != 200 || at(b, "next_cursor") != "4" {
		t.Fatalf("an integer cursor (an old next_cursor) pages by offset: %d %v", st, b)
	}
	if st, b := ra.do(t, "GET", boxes+"?limit=2", memberKey, nil); st != 200 || at(b, "next_cursor") != "2" {
		t.Fatalf("limit without page_size keeps offset cursors for older clients: %d %v", st, b)
	}
}
