package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	"github.com/cubicle-dev/cubicle/internal/store"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// addWorkspaceKeyViaStore creates workspace ws with an admin key (addKey)
// and returns a client acting as it.
func addWorkspaceKeyViaStore(t *testing.T, d *daemon, ws string) *cubicle.Client {
	return cubicle.New(d.Endpoint, addKey(t, d, ws, ws+"-admin", store.RoleAdmin))
}

// snapshotOutcome creates a snapshot of ref and waits for ready or failed.
func snapshotOutcome(t *testing.T, c *cubicle.Client, name, ref, registryID string) *protocol.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sn, err := c.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: name, DockerImage: ref, FSCapacityBytes: 1 << 30, RegistryID: registryID})
	if err != nil {
		t.Fatalf("create snapshot %s: %v", name, err)
	}
	sn, err = c.WaitSnapshot(ctx, sn.ID, nil)
	if err != nil && !errors.Is(err, cubicle.ErrSnapshotFailed) {
		t.Fatalf("wait snapshot %s: %v", name, err)
	}
	return sn
}

func listsDigest(t *testing.T, c *cubicle.Client, digest string) bool {
	t.Helper()
	imgs, err := c.ListImages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range imgs {
		if im.Digest == digest {
			return true
		}
	}
	return false
}

// TestImagesAcrossWorkspaces performs the cross-workspace image attacks:
// workspace B names A's private image by sha256: and by repo@sha256:, lists
// the store, removes A's image, and loads an image under a name A uses.
func TestImagesAcrossWorkspaces(t *testing.T) {
	host := imagetest.StartAuthRegistry(t, "puller", "pw")
	privRef := imagetest.PushAuth(t, host, "private/busybox:1", imagetest.BusyboxImage(t), "puller", "pw")
	d := startDaemon(t, "namespace", "")
	a := d.Client
	st, body := call(t, d, "POST", "/api/v2/sandboxes/registries", map[string]any{"name": "priv", "url": "http://" + host, "username": "puller", "password": "pw"})
	if st != 201 {
		t.Fatalf("create registry: %d %v", st, body)
	}
	priv := snapshotOutcome(t, a, "priv", privRef, body["id"].(string))
	if priv.Status != protocol.SnapshotReady {
		t.Fatalf("A's private snapshot: %s %s", priv.Status, priv.StatusMessage)
	}
	b := addWorkspaceKeyViaStore(t, d, "ws-b")

	var ae *cubicle.APIError
	_, err := b.CreateSnapshot(context.Background(), protocol.CreateSnapshotRequest{Name: "steal", DockerImage: priv.ImageDigest, FSCapacityBytes: 1 << 30})
	if !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Errorf("B: snapshot of A's private image by bare digest = %v, want 404", err)
	}
	for name, ref := range map[string]string{
		"repo-digest": host + "/private/busybox@" + priv.ImageDigest,
		"other-repo":  testImage(t)[:strings.LastIndex(testImage(t), "/")] + "/any/repo@" + priv.ImageDigest,
	} {
		sn := snapshotOutcome(t, b, "steal-"+name, ref, "")
		if sn.Status != protocol.SnapshotFailed {
			t.Errorf("B: snapshot of A's private image by %s (%s) is %s, want failed", name, ref, sn.Status)
		}
		if !strings.Contains(sn.StatusMessage, "not found") && !strings.Contains(sn.StatusMessage, "unauthorized") && !strings.Contains(sn.StatusMessage, "UNAUTHORIZED") {
			t.Errorf("B: %s failure %q does not say not found or unauthorized", name, sn.StatusMessage)
		}
	}
	if !listsDigest(t, a, priv.ImageDigest) {
		t.Errorf("A's GET /images does not list its own image")
	}
	if listsDigest(t, b, priv.ImageDigest) {
		t.Errorf("B's GET /images lists A's private image")
	}
	if n, err := b.ImageUsage(context.Background()); err != nil || n != 0 {
		t.Errorf("B's image usage = %d, %v; want 0", n, err)
	}
	if _, err := b.RemoveImage(context.Background(), privRef); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Errorf("B: rm A's image = %v, want 404", err)
	}
	if _, err := b.RemoveImage(context.Background(), priv.ImageDigest); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Errorf("B: rm A's digest = %v, want 404", err)
	}

	// Poisoning: B's admin loads an image under the public name A uses.
	pub := testImage(t)
	mine := snapshotOutcome(t, a, "pub", pub, "")
	if mine.Status != protocol.SnapshotReady {
		t.Fatalf("A's public snapshot: %s", mine.StatusMessage)
	}
	evil := imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}}, imagetest.Layer(t, imagetest.File("bin/sh", 0o755, "#!evil")))
	f, err := os.Open(imagetest.WriteDockerArchive(t, evil, pub))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	loaded, err := b.LoadImage(context.Background(), f, pub)
	if err != nil || len(loaded) != 1 || loaded[0].Digest == mine.ImageDigest {
		t.Fatalf("B: load under A's name: %v %v", loaded, err)
	}
	again := snapshotOutcome(t, a, "pub-again", pub, "")
	if again.Status != protocol.SnapshotReady || again.ImageDigest != mine.ImageDigest {
		t.Fatalf("A resolves %s to %s (%s) after B's load, want its own %s", pub, again.ImageDigest, again.StatusMessage, mine.ImageDigest)
	}
	sb := newSandbox(t, a, again.ID, nil)
	if out := mustRun(t, a, sb.Name, "echo still-mine"); out != "still-mine\n" {
		t.Fatalf("A's sandbox: %q", out)
	}
	if bs := snapshotOutcome(t, b, "poisoned", pub, ""); bs.ImageDigest != loaded[0].Digest {
		t.Errorf("B resolves %s to %s, want its own load %s", pub, bs.ImageDigest, loaded[0].Digest)
	}
}

// TestImageBombsAreBounded: a sparse-tar bomb (1.5 KiB claiming 5 GiB) and
// a gzip bomb (96 MiB of zeros in ~100 KiB) fail at the layer cap with a
// clear message, and the image store stays under the cap on disk.
func TestImageBombsAreBounded(t *testing.T) {
	const layerCap = 32 << 20
	d := startDaemonArgs(t, "namespace", "", "--image-max-bytes", "64MiB", "--image-layer-max-bytes", "32MiB")
	host := imagetest.StartRegistry(t)
	for name, data := range map[string][]byte{
		"sparse": imagetest.SparseBombTar(t, 5<<30),
		"gzip":   imagetest.ZerosTar(t, 96<<20),
	} {
		ref := imagetest.Push(t, host, "bomb/"+name+":1", imagetest.Image(t, v1.Config{}, imagetest.LayerFromTar(t, data)))
		sn := snapshotOutcome(t, d.Client, "bomb-"+name, ref, "")
		if sn.Status != protocol.SnapshotFailed || !strings.Contains(sn.StatusMessage, "more than 32 MiB, the per-layer cap") {
			t.Errorf("%s bomb: %s %q; want failed at the per-layer cap", name, sn.Status, sn.StatusMessage)
		}
		if n := duBytes(t, filepath.Join(d.dataDir, "images")); n > layerCap {
			t.Errorf("%s bomb: image store holds %d bytes on disk, cap %d", name, n, layerCap)
		} else {
			t.Logf("%s bomb: image store holds %d bytes after the failed pull", name, n)
		}
	}
}

// duBytes is the disk space allocated under dir.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command("du", "-s", "-B1", dir).Output()
	if err != nil {
		t.Fatalf("du %s: %v", dir, err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// rssBytes is the daemon's resident set size.
func rssBytes(t *testing.T, d *daemon) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestHugeImageConfigIsRefused: an image whose config carries 100 MiB of
// Env is refused at the config cap, with the daemon's memory and database
// bounded; an image with a large but allowed Env is stored once and kept
// out of GET /snapshots.
func TestHugeImageConfigIsRefused(t *testing.T) {
	d := startDaemon(t, "namespace", "")
	host := imagetest.StartRegistry(t)
	base := imagetest.BusyboxImage(t)
	cf, err := base.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := base.Layers()
	withEnv := func(env string) v1.Image {
		cfg := cf.Config
		cfg.Env = []string{"PATH=/bin:/usr/bin", "BIG=" + env}
		return imagetest.Image(t, cfg, layers...)
	}
	huge := imagetest.Push(t, host, "huge/env:1", withEnv(strings.Repeat("x", 100<<20)))
	sn := snapshotOutcome(t, d.Client, "huge", huge, "")
	if sn.Status != protocol.SnapshotFailed || !strings.Contains(sn.StatusMessage, "image config is larger than 8.0 MiB") {
		t.Fatalf("100 MiB Env: %s %q; want failed at the config cap", sn.Status, sn.StatusMessage)
	}
	if rss := rssBytes(t, d); rss > 200<<20 {
		t.Errorf("daemon RSS %d MiB after the huge config, want < 200 MiB", rss>>20)
	} else {
		t.Logf("daemon RSS %d MiB after the huge config", rss>>20)
	}

	// 512 KiB of Env is allowed: ten snapshots share one stored copy.
	big := imagetest.Push(t, host, "big/env:1", withEnv(strings.Repeat("y", 512<<10)))
	var last *protocol.Snapshot
	for i := range 10 {
		if last = snapshotOutcome(t, d.Client, fmt.Sprintf("big-%d", i), big, ""); last.Status != protocol.SnapshotReady {
			t.Fatalf("512 KiB Env: %s", last.StatusMessage)
		}
	}
	var dbBytes int64
	for _, f := range []string{"cubicle.db", "cubicle.db-wal"} {
		if fi, err := os.Stat(filepath.Join(d.dataDir, f)); err == nil {
			dbBytes += fi.Size()
		}
	}
	if dbBytes > 4<<20 {
		t.Errorf("database is %d bytes for ten snapshots of one 512 KiB Env, want it stored once", dbBytes)
	}
	t.Logf("database %d KiB for ten snapshots of one 512 KiB Env", dbBytes>>10)
	resp, err := http.NewRequest("GET", d.Endpoint+"/api/v2/sandboxes/snapshots?limit=500", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Set("X-Api-Key", testKey)
	res, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || len(raw) > 64<<10 {
		t.Errorf("GET /snapshots: %d, %d bytes; want a small answer", res.StatusCode, len(raw))
	}
	t.Logf("GET /snapshots of 11 snapshots: %d bytes", len(raw))
	got, err := d.Client.GetSnapshot(context.Background(), last.ID)
	if err != nil || got.RunConfig == nil || len(got.RunConfig.EnvVars["BIG"]) != 512<<10 {
		t.Errorf("GET /snapshots/{id} lost the image's Env: %v", err)
	}
}

// TestImageRmFreesLayers: `cubicle image rm` drops the name at once, keeps
// layers a snapshot still stacks, and frees them when the snapshot goes.
func TestImageRmFreesLayers(t *testing.T) {
	d := startDaemon(t, "namespace", "")
	host := imagetest.StartRegistry(t)
	payload := imagetest.File("payload", 0o644, strings.Repeat("p", 8<<20))
	ref := imagetest.Push(t, host, "rm/me:1", imagetest.Image(t, v1.Config{}, imagetest.Layer(t, payload)))
	sn := snapshotOutcome(t, d.Client, "rm", ref, "")
	if sn.Status != protocol.SnapshotReady {
		t.Fatalf("snapshot: %s", sn.StatusMessage)
	}
	imagesDir := filepath.Join(d.dataDir, "images")
	before := duBytes(t, imagesDir)
	bin, _ := binaries(t)
	cli := exec.Command(bin, "image", "rm", ref)
	cli.Env = append(os.Environ(), "CUBICLE_ENDPOINT="+d.Endpoint, "CUBICLE_API_KEY="+testKey)
	out, err := cli.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "removed "+ref+"; freed 0 layer(s)") {
		t.Fatalf("cubicle image rm while a snapshot uses it: %v %s", err, out)
	}
	if listsDigest(t, d.Client, sn.ImageDigest) {
		t.Errorf("image still listed after rm")
	}
	if now := duBytes(t, imagesDir); now < before-(1<<20) {
		t.Errorf("layers a snapshot stacks were freed: %d → %d bytes", before, now)
	}
	if err := d.Client.DeleteSnapshot(context.Background(), sn.ID); err != nil {
		t.Fatal(err)
	}
	if after := duBytes(t, imagesDir); before-after < 8<<20 {
		t.Errorf("image store %d → %d bytes after rm and snapshot delete; want the 8 MiB layer freed", before, after)
	}
}
