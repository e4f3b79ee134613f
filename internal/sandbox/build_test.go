package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/build"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// contextTar is a build context with files.
func contextTar(t *testing.T, files map[string]string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	return &buf
}

// waitBuilt waits for snapshot id's build to end.
func waitBuilt(t *testing.T, e *env, id string) *store.Snapshot {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		sn, err := e.st.GetSnapshot(context.Background(), workspace, id)
		if err != nil {
			t.Fatal(err)
		}
		if sn.Status != protocol.SnapshotBuilding {
			return sn
		}
	}
	t.Fatalf("snapshot %s still building", id)
	return nil
}

// TestBuildSnapshotStacksAndCaches builds COPY/WORKDIR steps (no RUN: the
// fake agent runs no commands) on the default snapshot: the result stacks
// the base's layers and the steps', carries the run config, and a rebuild
// takes every step from the workspace's cache.
func TestBuildSnapshotStacksAndCaches(t *testing.T) {
	e := newEnv(t)
	df := "FROM default\nENV A=1\nWORKDIR /app\nCOPY f.txt ./\nUSER 1000\n"
	buildApp := func() *store.Snapshot {
		v, err := e.m.BuildSnapshot(as(member), protocol.BuildSnapshotRequest{Name: "app", Dockerfile: df}, contextTar(t, map[string]string{"f.txt": "hi"}))
		if err != nil {
			t.Fatal(err)
		}
		return waitBuilt(t, e, v.ID)
	}
	sn := buildApp()
	if sn.Status != protocol.SnapshotReady || len(sn.Layers) != 3 || sn.Layers[0] != e.snap.Layers[0] {
		t.Fatalf("built: %s %q, layers %v", sn.Status, sn.StatusMessage, sn.Layers)
	}
	if got, err := os.ReadFile(filepath.Join(sn.Layers[2], "app", "f.txt")); err != nil || string(got) != "hi" {
		t.Fatalf("COPY layer: %q %v", got, err)
	}
	if rc := sn.RunConfig; rc.User != "1000" || rc.WorkDir != "/app" || rc.EnvVars["A"] != "1" {
		t.Fatalf("run_config %+v", rc)
	}
	entries, err := e.st.ListBuildCache(context.Background(), workspace)
	if err != nil || len(entries) != 2 {
		t.Fatalf("cache after one build: %d entries, %v", len(entries), err)
	}
	again := buildApp()
	if again.Status != protocol.SnapshotReady || again.StatusMessage[:len("built 2 layer steps (2 cached)")] != "built 2 layer steps (2 cached)" ||
		again.Layers[2] != sn.Layers[2] {
		t.Fatalf("rebuild: %q, layers %v (first %v)", again.StatusMessage, again.Layers, sn.Layers)
	}
	log, err := e.m.BuildLog(as(member), again.ID)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := log.Follow(context.Background(), &buf, nil); err != nil || !bytes.Contains(buf.Bytes(), []byte("#3 CACHED")) {
		t.Fatalf("build log: %q %v", buf.String(), err)
	}
}

// TestBuildCachePrune checks pruning drops least recently used results
// past BuildCacheBytes, counting and deleting only layers no snapshot
// stacks.
func TestBuildCachePrune(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.BuildCacheBytes = 10 })
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	for i, id := range []string{"a", "b", "c"} {
		layer := e.storage.CaptureLayer(id)
		if err := os.MkdirAll(layer, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := e.st.PutBuildCache(ctx, &store.BuildCacheEntry{WorkspaceID: workspace, Key: "k" + id, LayerID: id, Layer: layer,
			SizeBytes: 6, CreatedAt: old, UsedAt: old.Add(time.Duration(i) * time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	// Snapshot "pinned" stacks a's layer, the least recently used.
	now := time.Now()
	if err := e.st.CreateSnapshot(ctx, &store.Snapshot{ID: "pinned", WorkspaceID: workspace, CreatedBy: "alice", Name: "pinned",
		Status: protocol.SnapshotReady, Layers: []string{e.storage.CaptureLayer("a")}, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.pruneBuildCache(ctx, workspace); err != nil {
		t.Fatal(err)
	}
	entries, _ := e.st.ListBuildCache(ctx, workspace)
	var keys []string
	for _, en := range entries {
		keys = append(keys, en.Key)
	}
	if len(keys) != 2 || keys[0] != "ka" || keys[1] != "kc" {
		t.Fatalf("after prune: %v, want [ka kc] (a pinned, b least recently used)", keys)
	}
	if _, err := os.Stat(e.storage.CaptureLayer("b")); !os.IsNotExist(err) {
		t.Fatalf("pruned layer b still there: %v", err)
	}
	if _, err := os.Stat(e.storage.CaptureLayer("a")); err != nil {
		t.Fatalf("pinned layer a removed: %v", err)
	}
}

// TestBuildInterruptedByRestart checks a Dockerfile build, and an image
// export from a sandbox (capture with docker_image), cut short by a
// restart are failed at recovery (their context or stream is gone), not
// resumed as pulls.
func TestBuildInterruptedByRestart(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	for _, sn := range []*store.Snapshot{
		{ID: "half", WorkspaceID: workspace, CreatedBy: "bob", Name: "half", Status: protocol.SnapshotBuilding, CreatedAt: now, UpdatedAt: now},
		{ID: "export", WorkspaceID: workspace, CreatedBy: "bob", Name: "export", Status: protocol.SnapshotBuilding, CreatedAt: now, UpdatedAt: now,
			DockerImage: "busybox", SourceSandboxID: "sb-gone"},
	} {
		if err := e.st.CreateSnapshot(context.Background(), sn); err != nil {
			t.Fatal(err)
		}
	}
	e.reopen(t)
	for _, name := range []string{"half", "export"} {
		if sn := waitBuilt(t, e, name); sn.Status != protocol.SnapshotFailed || len(sn.Layers) != 0 {
			t.Fatalf("interrupted %s after restart: %s %q", name, sn.Status, sn.StatusMessage)
		}
	}
}

// TestBuildSnapshotRefusesBadDockerfile checks a bad Dockerfile is
// refused before any record exists.
func TestBuildSnapshotRefusesBadDockerfile(t *testing.T) {
	e := newEnv(t)
	_, err := e.m.BuildSnapshot(as(member), protocol.BuildSnapshotRequest{Name: "bad", Dockerfile: "FROM default\nVOLUME /x\n"}, contextTar(t, nil))
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("line 2")) {
		t.Fatalf("bad Dockerfile: %v", err)
	}
	if list, _ := e.st.ListSnapshots(context.Background(), workspace, store.ListOptions{Name: "bad"}); len(list) != 0 {
		t.Fatalf("a refused build left %d records", len(list))
	}
}

// TestBuildLogsKeepsTheLast checks finished builds' logs are kept for the
// last keptBuildLogs builds only.
func TestBuildLogsKeepsTheLast(t *testing.T) {
	var b buildLogs
	for i := range keptBuildLogs + 1 {
		b.add(fmt.Sprint(i), build.NewLog())
	}
	if b.get("0") != nil || b.get("1") == nil || b.get(fmt.Sprint(keptBuildLogs)) == nil {
		t.Fatal("buildLogs kept the wrong logs")
	}
}
