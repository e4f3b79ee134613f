package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/build"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/gateway"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/secrets"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// API keys the fake authenticator knows.
const (
	adminKey  = "admin-key"
	memberKey = "member-key"
)

var principals = map[string]auth.Principal{
	adminKey:  {WorkspaceID: "w1", User: "ann", Role: store.RoleAdmin},
	memberKey: {WorkspaceID: "w1", User: "bob", Role: store.RoleMember},
}

type fakeAuth struct{}

func (fakeAuth) Authenticate(_ context.Context, key string) (auth.Principal, error) {
	if p, ok := principals[key]; ok {
		return p, nil
	}
	return auth.Principal{}, fmt.Errorf("bad API key: %w", errdefs.ErrUnauthorized)
}

// fakeSandboxes is an in-memory manager: sandboxes by name, visible by
// the authz rule, plus the calls the handlers made. fail, when set, is
// returned by every call.
type fakeSandboxes struct {
	sandboxes map[string]*store.Sandbox
	snapshots map[string]*store.Snapshot
	fail      error
	calls     []string
	create    protocol.CreateSandboxRequest
	update    protocol.UpdateSandboxRequest
	restore   *bool // the restore_memory the last start carried
	list      store.ListOptions
	listN     int // how many items a list returns
	dpOp      authz.Op
	// build and buildContext are the last Dockerfile build's request and
	// the context it sent.
	build        protocol.BuildSnapshotRequest
	buildContext string
	// share is the last share call: its kind, resource ref, request and
	// share id.
	share struct {
		kind, ref, id string
		req           sandbox.ShareRequest
	}
}

func newFakeSandboxes() *fakeSandboxes {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &fakeSandboxes{
		sandboxes: map[string]*store.Sandbox{
			"bobs": {ID: "id-bobs", WorkspaceID: "w1", CreatedBy: "bob", Name: "bobs", Status: protocol.StatusReady, CreatedAt: now, UpdatedAt: now},
			"anns": {ID: "id-anns", WorkspaceID: "w1", CreatedBy: "ann", Name: "anns", Status: protocol.StatusStopped, StatusMessage: "idle", CreatedAt: now, UpdatedAt: now},
		},
		snapshots: map[string]*store.Snapshot{
			"sn1": {ID: "sn1", WorkspaceID: "w1", CreatedBy: "bob", Name: "base", Status: protocol.SnapshotReady,
				RunConfig: protocol.RunConfig{User: "0", EnvVars: map[string]string{"A": "1"}}, CreatedAt: now, UpdatedAt: now},
		},
	}
}

func (f *fakeSandboxes) call(name string) error {
	f.calls = append(f.calls, name)
	return f.fail
}

func (f *fakeSandboxes) called(name string) bool {
	for _, c := range f.calls {
		if c == name {
			return true
		}
	}
	return false
}

// visible applies the one policy, as the manager does.
func (f *fakeSandboxes) visible(ctx context.Context, name string) (*store.Sandbox, error) {
	p, _ := auth.FromContext(ctx)
	sb, ok := f.sandboxes[name]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", name, errdefs.ErrNotFound)
	}
	if err := authz.Check(p, authz.Sandbox(sb), authz.Get, "sandbox "+name); err != nil {
		return nil, err
	}
	return sb, nil
}

func (f *fakeSandboxes) view(id string) (*sandbox.SnapshotView, error) {
	sn, ok := f.snapshots[id]
	if !ok {
		return nil, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return &sandbox.SnapshotView{Snapshot: sn}, nil
}

func (f *fakeSandboxes) CreateSnapshot(_ context.Context, req protocol.CreateSnapshotRequest) (*sandbox.SnapshotView, error) {
	if err := f.call("CreateSnapshot"); err != nil {
		return nil, err
	}
	sn := &store.Snapshot{ID: "sn-new", Name: req.Name, Status: protocol.SnapshotBuilding, DockerImage: req.DockerImage}
	f.snapshots[sn.ID] = sn
	return &sandbox.SnapshotView{Snapshot: sn, PullBytesTotal: 10}, nil
}

// BuildSnapshot records the request and the context it read, and
// keeps a closed log with that context for the build-log route.
func (f *fakeSandboxes) BuildSnapshot(_ context.Context, req protocol.BuildSnapshotRequest, ctxTar io.Reader) (*sandbox.SnapshotView, error) {
	if err := f.call("BuildSnapshot"); err != nil {
		return nil, err
	}
	body, err := io.ReadAll(ctxTar)
	if err != nil {
		return nil, err
	}
	f.build, f.buildContext = req, string(body)
	sn := &store.Snapshot{ID: "sn-built", WorkspaceID: "w1", Name: req.Name, Status: protocol.SnapshotBuilding}
	f.snapshots[sn.ID] = sn
	return &sandbox.SnapshotView{Snapshot: sn}, nil
}

func (f *fakeSandboxes) BuildLog(_ context.Context, id string) (*build.Log, error) {
	if err := f.call("BuildLog"); err != nil {
		return nil, err
	}
	if id != "sn-built" {
		return nil, errdefs.ErrNotFound
	}
	l := build.NewLog()
	io.WriteString(l, "#1 [stage 1/1] FROM busybox\n"+f.buildContext)
	l.Close()
	return l, nil
}

func (f *fakeSandboxes) GetSnapshot(_ context.Context, id string) (*sandbox.SnapshotView, error) {
	if err := f.call("GetSnapshot"); err != nil {
		return nil, err
	}
	return f.view(id)
}

func (f *fakeSandboxes) ListSnapshots(_ context.Context, o store.ListOptions) ([]*sandbox.SnapshotView, error) {
	if err := f.call("ListSnapshots"); err != nil {
		return nil, err
	}
	f.list = o
	out := []*sandbox.SnapshotView{}
	for range f.listN {
		v, _ := f.view("sn1")
		out = append(out, v)
	}
	return out, nil
}

func (f *fakeSandboxes) DeleteSnapshot(_ context.Context, id string) error {
	if err := f.call("DeleteSnapshot"); err != nil {
		return err
	}
	_, err := f.view(id)
	return err
}

func (f *fakeSandboxes) LayersInUse(context.Context) ([]string, error) {
	return []string{"layer-in-use"}, f.call("LayersInUse")
}

func (f *fakeSandboxes) CreateSandbox(ctx context.Context, req protocol.CreateSandboxRequest) (*store.Sandbox, error) {
	if err := f.call("CreateSandbox"); err != nil {
		return nil, err
	}
	f.create = req
	p, _ := auth.FromContext(ctx)
	sb := &store.Sandbox{ID: "id-" + req.Name, WorkspaceID: p.WorkspaceID, CreatedBy: p.User, Name: req.Name,
		Status: protocol.StatusReady, SnapshotID: req.SnapshotID, RunConfig: req.RunConfig}
	f.sandboxes[req.Name] = sb
	return sb, nil
}

func (f *fakeSandboxes) GetSandbox(ctx context.Context, name string) (*store.Sandbox, error) {
	if err := f.call("GetSandbox"); err != nil {
		return nil, err
	}
	return f.visible(ctx, name)
}

func (f *fakeSandboxes) ListSandboxes(ctx context.Context, o store.ListOptions) ([]*store.Sandbox, error) {
	if err := f.call("ListSandboxes"); err != nil {
		return nil, err
	}
	f.list = o
	out := []*store.Sandbox{}
	for range f.listN {
		out = append(out, f.sandboxes["bobs"])
	}
	return out, nil
}

func (f *fakeSandboxes) UpdateSandbox(ctx context.Context, name string, req protocol.UpdateSandboxRequest) (*store.Sandbox, error) {
	if err := f.call("UpdateSandbox"); err != nil {
		return nil, err
	}
	f.update = req
	return f.visible(ctx, name)
}

func (f *fakeSandboxes) StopSandbox(ctx context.Context, name string) (*store.Sandbox, error) {
	if err := f.call("StopSandbox"); err != nil {
		return nil, err
	}
	sb, err := f.visible(ctx, name)
	if err == nil {
		sb.Status = protocol.StatusStopped
	}
	return sb, err
}

func (f *fakeSandboxes) StartSandbox(ctx context.Context, name string) (*store.Sandbox, error) {
	if err := f.call("StartSandbox"); err != nil {
		return nil, err
	}
	f.restore = sandbox.RestoreMemory(ctx)
	sb, err := f.visible(ctx, name)
	if err == nil {
		sb.Status = protocol.StatusReady
	}
	return sb, err
}

func (f *fakeSandboxes) DeleteSandbox(ctx context.Context, name string) error {
	if err := f.call("DeleteSandbox"); err != nil {
		return err
	}
	_, err := f.visible(ctx, name)
	if err == nil {
		delete(f.sandboxes, name)
	}
	return err
}

func (f *fakeSandboxes) CaptureSnapshot(ctx context.Context, name string, req protocol.CaptureSnapshotRequest) (*sandbox.SnapshotView, error) {
	if err := f.call("CaptureSnapshot"); err != nil {
		return nil, err
	}
	sb, err := f.visible(ctx, name)
	if err != nil {
		return nil, err
	}
	return &sandbox.SnapshotView{Snapshot: &store.Snapshot{ID: "cap", Name: req.Name, Status: protocol.SnapshotReady, SourceSandboxID: sb.ID}}, nil
}

func (f *fakeSandboxes) Fork(ctx context.Context, name string, req protocol.ForkRequest) (*sandbox.ForkResult, error) {
	if err := f.call("Fork"); err != nil {
		return nil, err
	}
	sb, err := f.visible(ctx, name)
	if err != nil {
		return nil, err
	}
	res := &sandbox.ForkResult{Snapshot: &store.Snapshot{ID: "fork-snap"}}
	for i := range req.Count {
		res.Sandboxes = append(res.Sandboxes, &store.Sandbox{ID: fmt.Sprintf("%s-%d", sb.ID, i), Name: fmt.Sprintf("%s-%d", name, i)})
	}
	return res, nil
}

func (f *fakeSandboxes) ResetSandbox(ctx context.Context, name, snapshotID string) (*store.Sandbox, error) {
	if err := f.call("ResetSandbox"); err != nil {
		return nil, err
	}
	sb, err := f.visible(ctx, name)
	if err == nil && snapshotID != "" {
		sb.SnapshotID = snapshotID
	}
	return sb, err
}

func (f *fakeSandboxes) Diff(_ context.Context, a, b string) ([]storage.Change, error) {
	if err := f.call("Diff"); err != nil {
		return nil, err
	}
	return []storage.Change{{Path: "/etc/" + b, Kind: protocol.DiffAdded, Size: 3}}, nil
}

func (f *fakeSandboxes) Usage(_ context.Context, sbs []*store.Sandbox, sns []*store.Snapshot) (map[string]int64, error) {
	out := map[string]int64{}
	for _, sb := range sbs {
		out[sb.ID] = 111
	}
	for _, sn := range sns {
		out[sn.ID] = 222
	}
	return out, f.call("Usage")
}

func (f *fakeSandboxes) Dataplane(ctx context.Context, id string, op authz.Op) (*sandbox.Conn, error) {
	f.dpOp = op
	if err := f.call("Dataplane"); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

func (f *fakeSandboxes) GrantDataplane(_ context.Context, ws, id string) (*sandbox.Conn, error) {
	if err := f.call("GrantDataplane"); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("sandbox %s in %s: %w", id, ws, errdefs.ErrNotFound)
}

func (f *fakeSandboxes) Share(_ context.Context, kind, ref string, req sandbox.ShareRequest) (*store.Share, error) {
	f.share.kind, f.share.ref, f.share.req = kind, ref, req
	if err := f.call("Share"); err != nil {
		return nil, err
	}
	return &store.Share{ID: "sh1", ResourceKind: kind, ResourceID: "id-" + ref, Grantee: req.UserID, Access: req.Access,
		CreatedBy: "bob", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}, nil
}

func (f *fakeSandboxes) ListShares(_ context.Context, kind, ref string) ([]*store.Share, error) {
	f.share.kind, f.share.ref = kind, ref
	if err := f.call("ListShares"); err != nil {
		return nil, err
	}
	return []*store.Share{{ID: "sh1", ResourceKind: kind, Grantee: "*", Access: "read"}}, nil
}

func (f *fakeSandboxes) Unshare(_ context.Context, kind, ref, id string) error {
	f.share.kind, f.share.ref, f.share.id = kind, ref, id
	return f.call("Unshare")
}

func (f *fakeSandboxes) StatusMessage(context.Context, string) string { return "" }

func (f *fakeSandboxes) Stats(ctx context.Context, name string) (*protocol.SandboxStats, error) {
	sb, err := f.visible(ctx, name)
	if err != nil {
		return nil, err
	}
	return &protocol.SandboxStats{ID: sb.ID, Name: sb.Name, Status: sb.Status, CPUSeconds: 2}, nil
}

func (f *fakeSandboxes) Leftovers(context.Context) ([]protocol.Leftover, error) {
	return []protocol.Leftover{{Kind: "network", ID: "gone"}}, nil
}

func (f *fakeSandboxes) CleanLeftovers(context.Context) ([]protocol.Leftover, error) {
	f.calls = append(f.calls, "clean-leftovers")
	return []protocol.Leftover{{Kind: "network", ID: "gone"}}, nil
}

func (f *fakeSandboxes) ListStats(ctx context.Context) ([]protocol.SandboxStats, error) {
	var out []protocol.SandboxStats
	for name := range f.sandboxes {
		if st, err := f.Stats(ctx, name); err == nil {
			out = append(out, *st)
		}
	}
	return out, nil
}
func (f *fakeSandboxes) Runtimes() []protocol.ServedRuntime {
	return []protocol.ServedRuntime{{Name: "fake-runtime"}}
}
func (f *fakeSandboxes) StorageBackend() string { return "fake-storage" }

// fakeImages is an image store with fixed contents.
type fakeImages struct {
	loaded, removed string
	gcInUse         []string
}

func (f *fakeImages) LoadReader(_ context.Context, ws string, r io.Reader, name string) ([]*image.Image, error) {
	b, _ := io.ReadAll(r)
	f.loaded = ws + ":" + name + ":" + string(b)
	return []*image.Image{{Ref: name, Digest: "sha256:aa", Size: int64(len(b))}}, nil
}

func (f *fakeImages) List(_ context.Context, ws string) ([]*image.Image, error) {
	return []*image.Image{{Ref: ws + "/busybox", Digest: "sha256:bb", Size: 5}}, nil
}

func (f *fakeImages) Usage(context.Context, string) (int64, error) { return 42, nil }

func (f *fakeImages) Remove(_ context.Context, ws, ref string) error {
	if ref == "missing" {
		return fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	f.removed = ws + ":" + ref
	return nil
}

func (f *fakeImages) GC(_ context.Context, inUse []string) (image.GCResult, error) {
	f.gcInUse = inUse
	return image.GCResult{Images: 1, Layers: 2, Bytes: 300}, nil
}

// fakeGateway mints fixed links and accepts the token "good".
type fakeGateway struct {
	ttl   time.Duration
	embed []string
}

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusTeapot)
}
func (g *fakeGateway) OwnsHost(host string) bool { return strings.HasSuffix(host, ".svc.test") }

func (g *fakeGateway) IssueService(_ context.Context, sb *store.Sandbox, port int, ttl time.Duration, embed []string) (gateway.ServiceLink, error) {
	g.ttl, g.embed = ttl, embed
	l := gateway.ServiceLink{ServiceURL: fmt.Sprintf("http://%s-%d.svc.test", sb.ID, port), BrowserURL: "http://b", Token: "tok",
		ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	if len(embed) > 0 {
		l.EmbedURL = "http://embed"
	}
	return l, nil
}

func (g *fakeGateway) GrantLogin(_ context.Context, sb *store.Sandbox, port int, access string, embed []string) gateway.LoginLink {
	g.embed = embed
	return gateway.LoginLink{ServiceURL: "http://s", BrowserURL: "http://login", Access: access}
}

func (g *fakeGateway) IssueDownload(_ context.Context, sb *store.Sandbox, path, ct, disp string, ttl time.Duration) (gateway.DownloadLink, error) {
	g.ttl = ttl
	l := gateway.DownloadLink{URL: "http://d/" + sb.ID + path, Token: "dl"}
	if ttl > 0 {
		l.ExpiresAt = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return l, nil
}

func (g *fakeGateway) VerifyDownload(token string) (gateway.Claims, error) {
	if token != "good" {
		return gateway.Claims{}, fmt.Errorf("bad link: %w", errdefs.ErrUnauthorized)
	}
	return gateway.Claims{Workspace: "w1", Sandbox: "id-bobs", Path: "/f"}, nil
}

// fakeRegistries keeps registries by name.
type fakeRegistries struct{ regs map[string]*store.Registry }

func (f *fakeRegistries) Create(_ context.Context, req protocol.CreateRegistryRequest) (*store.Registry, error) {
	if req.Password == "" {
		return nil, errdefs.Field("password", "is required")
	}
	r := &store.Registry{ID: "r-" + req.Name, Name: req.Name, URL: req.URL}
	f.regs[req.Name] = r
	return r, nil
}

func (f *fakeRegistries) Get(_ context.Context, name string) (*store.Registry, error) {
	if r, ok := f.regs[name]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("registry %s: %w", name, errdefs.ErrNotFound)
}

func (f *fakeRegistries) List(context.Context, store.ListOptions) ([]*store.Registry, error) {
	var out []*store.Registry
	for _, r := range f.regs {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeRegistries) Update(ctx context.Context, name string, req protocol.UpdateRegistryRequest) (*store.Registry, error) {
	r, err := f.Get(ctx, name)
	if err == nil && req.URL != nil {
		r.URL = *req.URL
	}
	return r, err
}

func (f *fakeRegistries) Delete(ctx context.Context, name string) error {
	_, err := f.Get(ctx, name)
	delete(f.regs, name)
	return err
}

// fakeVault keeps secrets per workspace.
type fakeVault struct{ put map[string]string }

func (v *fakeVault) Put(_ context.Context, ws, name string, value []byte, shared bool) (secrets.SecretInfo, error) {
	v.put[ws+"/"+name] = string(value)
	return secrets.SecretInfo{Name: name, MembersMayUse: shared}, nil
}

func (v *fakeVault) List(_ context.Context, p auth.Principal) []secrets.SecretInfo {
	out := []secrets.SecretInfo{}
	for k := range v.put {
		if strings.HasPrefix(k, p.WorkspaceID+"/") && authz.MayUseSecret(p, false) {
			out = append(out, secrets.SecretInfo{Name: strings.TrimPrefix(k, p.WorkspaceID+"/")})
		}
	}
	return out
}

func (v *fakeVault) Delete(_ context.Context, ws, name string) error {
	if _, ok := v.put[ws+"/"+name]; !ok {
		return fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
	}
	delete(v.put, ws+"/"+name)
	return nil
}

type fakeEgress struct{}

func (fakeEgress) Log(id string) proxy.Report { return proxy.Report{Mode: "allow_list:" + id} }

// testAPI is a Server over fakes.
type testAPI struct {
	srv    *Server
	mgr    *fakeSandboxes
	images *fakeImages
	gw     *fakeGateway
	vault  *fakeVault
}

func newTestAPI(t *testing.T, withGateway bool) *testAPI {
	t.Helper()
	ta := &testAPI{mgr: newFakeSandboxes(), images: &fakeImages{}, gw: &fakeGateway{}, vault: &fakeVault{put: map[string]string{}}}
	var opts []Option
	if withGateway {
		opts = append(opts, func(s *Server) { s.gw = ta.gw })
	}
	ta.srv = New(ta.mgr, fakeAuth{}, ta.images, "http://api.test/", slog.New(slog.DiscardHandler), opts...)
	ta.srv.enableEgress(ta.vault, fakeEgress{})
	return ta
}

// do sends a request with key (none if "") and body (JSON-encoded unless a
// string) and returns the status and the decoded body.
func (ta *testAPI) do(t *testing.T, method, path, key string, body any) (int, any) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req := httptest.NewRequest(method, path, rd)
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	rec := httptest.NewRecorder()
	ta.srv.ServeHTTP(rec, req)
	var out any
	if rec.Body.Len() > 0 {
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			out = rec.Body.String()
		}
	}
	return rec.Code, out
}

// detailError returns detail.error of a structured error body ("" if the
// body is not one).
func detailError(body any) string {
	m, _ := body.(map[string]any)
	d, _ := m["detail"].(map[string]any)
	s, _ := d["error"].(string)
	return s
}

// validation returns the loc (joined by "/") and type of the first item of
// a Pydantic 422 body.
func validation(body any) (loc, typ string) {
	m, _ := body.(map[string]any)
	items, _ := m["detail"].([]any)
	if len(items) == 0 {
		return "", ""
	}
	it, _ := items[0].(map[string]any)
	var parts []string
	locs, _ := it["loc"].([]any)
	for _, l := range locs {
		parts = append(parts, fmt.Sprint(l))
	}
	typ, _ = it["type"].(string)
	if msg, _ := it["msg"].(string); msg == "" {
		return "", ""
	}
	return strings.Join(parts, "/"), typ
}

// field returns body[k] for an object body.
func field(body any, k string) any {
	m, _ := body.(map[string]any)
	return m[k]
}
