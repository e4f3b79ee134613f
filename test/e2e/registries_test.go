package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestRegistries drives the registries API (spec §3.4) and pulls a
// snapshot from a registry that requires basic auth.
func TestRegistries(t *testing.T) {
	host := imagetest.StartAuthRegistry(t, "puller", "right-pw")
	ref := imagetest.PushAuth(t, host, "private/busybox:1", imagetest.BusyboxImage(t), "puller", "right-pw")
	d := startDaemon(t, "namespace", "")
	const base = "/api/v2/sandboxes/registries"

	st, body := call(t, d, "POST", base, map[string]any{"name": "priv", "url": "http://" + host, "username": "puller", "password": "wrong-pw"})
	if st != 201 {
		t.Fatalf("create registry: %d %v", st, body)
	}
	for _, k := range []string{"id", "name", "url", "created_at", "created_by", "updated_at", "updated_by"} {
		if _, ok := body[k]; !ok {
			t.Fatalf("registry JSON %v lacks %q", body, k)
		}
	}
	if _, ok := body["password"]; ok {
		t.Fatalf("registry JSON returns the password: %v", body)
	}
	regID := body["id"].(string)

	st, body = call(t, d, "POST", base, map[string]any{"name": "priv", "url": host, "username": "u", "password": "p"})
	structured(t, st, 409, body, "Conflict")
	st, body = call(t, d, "POST", base, map[string]any{"name": "nopw", "url": host, "username": "u"})
	pydantic(t, st, body, "password")
	st, body = call(t, d, "POST", base, map[string]any{"name": "badurl", "url": "ftp://x", "username": "u", "password": "p"})
	pydantic(t, st, body, "url")
	st, body = call(t, d, "GET", base+"?limit=10", nil)
	if regs, _ := body["registries"].([]any); st != 200 || len(regs) != 1 || regs[0].(map[string]any)["name"] != "priv" {
		t.Fatalf("list registries: %d %v", st, body)
	}
	st, body = call(t, d, "GET", base+"/priv", nil)
	if st != 200 || body["id"] != regID {
		t.Fatalf("get registry: %d %v", st, body)
	}

	snapshot := func(name, registryID string) *protocol.Snapshot {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sn, err := d.Client.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: name, DockerImage: ref, FSCapacityBytes: 1 << 30, RegistryID: registryID})
		if err != nil {
			t.Fatalf("create snapshot %s: %v", name, err)
		}
		sn, _ = d.Client.WaitSnapshot(ctx, sn.ID, nil)
		if sn, err = d.Client.GetSnapshot(ctx, sn.ID); err != nil {
			t.Fatal(err)
		}
		return sn
	}
	if sn := snapshot("anon", ""); sn.Status != protocol.SnapshotFailed {
		t.Fatalf("anonymous pull of a private image: %s", sn.Status)
	}
	if sn := snapshot("wrong", regID); sn.Status != protocol.SnapshotFailed {
		t.Fatalf("pull with a wrong password: %s %s", sn.Status, sn.StatusMessage)
	}
	st, body = call(t, d, "PATCH", base+"/priv", map[string]any{"password": "right-pw"})
	if st != 200 || body["id"] != regID {
		t.Fatalf("patch registry: %d %v", st, body)
	}
	sn := snapshot("private", regID)
	if sn.Status != protocol.SnapshotReady || sn.RegistryID != regID {
		t.Fatalf("pull with the right password: %+v", sn)
	}
	sb := newSandbox(t, d.Client, sn.ID, nil)
	if out := mustRun(t, d.Client, sb.Name, "echo from-private"); out != "from-private\n" {
		t.Fatalf("sandbox from private image: %q", out)
	}

	// registry_id must exist and match the image's host.
	st, body = call(t, d, "POST", "/v2/sandboxes/snapshots", map[string]any{"name": "x", "docker_image": ref, "fs_capacity_bytes": 1 << 30, "registry_id": "00000000-0000-0000-0000-000000000000"})
	pydantic(t, st, body, "registry_id")
	st, body = call(t, d, "POST", "/v2/sandboxes/snapshots", map[string]any{"name": "x", "docker_image": "docker.io/library/busybox", "fs_capacity_bytes": 1 << 30, "registry_id": regID})
	pydantic(t, st, body, "registry_id")

	// At rest: a 0600 key, and no password in the database files.
	if fi, err := os.Stat(filepath.Join(d.dataDir, "secrets.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets.key: %v %v", fi, err)
	}
	for _, f := range []string{"cubicle.db", "cubicle.db-wal"} {
		raw, _ := os.ReadFile(filepath.Join(d.dataDir, f))
		if bytes.Contains(raw, []byte("right-pw")) || bytes.Contains(raw, []byte("wrong-pw")) {
			t.Fatalf("%s holds a registry password in plaintext", f)
		}
	}

	resp, _ := p3Do(t, "DELETE", d.Endpoint+base+"/priv", nil, map[string]string{"Accept": "*/*"})
	if resp.StatusCode/100 != 2 {
		t.Fatalf("delete registry: %d", resp.StatusCode)
	}
	st, body = call(t, d, "GET", base+"/priv", nil)
	structured(t, st, 404, body, "NotFound")
}
