package sandbox

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// fakeDocker answers `docker save` with archive (exit 0) or, when
// archive is "", with a failure on stderr.
type fakeDocker struct {
	archive string
	got     protocol.ExecFrame
}

func (f *fakeDocker) Exec(_ context.Context, req protocol.ExecFrame, stdout, stderr io.Writer) (int, error) {
	f.got = req
	if f.archive == "" {
		io.WriteString(stderr, "Error response from daemon: reference does not exist")
		return 1, nil
	}
	_, err := io.WriteString(stdout, f.archive)
	return 0, err
}

// TestExportImage: the image is saved by docker as root, byte for byte,
// and loaded into the workspace; a failing docker save or an archive
// that is no image fails with what went wrong.
func TestExportImage(t *testing.T) {
	e := newEnv(t, withImages(&images{layer: t.TempDir()}))
	ctx := context.Background()
	d := &fakeDocker{archive: "manifest.json busybox layers"}
	img, err := e.m.exportImage(ctx, d, workspace, "langsmith-snapshot-build:x'y")
	if err != nil {
		t.Fatal(err)
	}
	img.Release()
	if img.Digest != "sha256:abc" || d.got.RunConfig.User != "root" || d.got.Encoding != protocol.EncodingBase64 ||
		d.got.Command != `exec docker save -- 'langsmith-snapshot-build:x'\''y'` {
		t.Fatalf("exported %s with %+v", img.Digest, d.got)
	}
	if _, err := e.m.exportImage(ctx, &fakeDocker{}, workspace, "missing:1"); err == nil || !strings.Contains(err.Error(), "reference does not exist") {
		t.Fatalf("failing docker save: %v", err)
	}
	if _, err := e.m.exportImage(ctx, &fakeDocker{archive: "not an image"}, workspace, "odd:1"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("an archive that is no image: %v", err)
	}
}

// TestCaptureDockerImageNeedsReady: docker_image with include_memory is
// refused, a sandbox without Docker inside has none to export from, and
// neither has a stopped one.
func TestCaptureDockerImageNeedsReady(t *testing.T) {
	e := newEnv(t)
	e.create(t, member, "plain")
	var fe *errdefs.FieldError
	if _, err := e.m.CaptureSnapshot(as(member), "plain", protocol.CaptureSnapshotRequest{Name: "p", DockerImage: "x:1"}); !errors.As(err, &fe) || fe.Field != "docker_image" || !strings.Contains(fe.Error(), "does not run Docker") {
		t.Fatalf("docker_image from a sandbox without Docker inside: %v", err)
	}
	if _, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "b", Docker: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.CaptureSnapshot(as(member), "b", protocol.CaptureSnapshotRequest{Name: "m", DockerImage: "x:1", IncludeMemory: true})
	if !errors.As(err, &fe) || fe.Field != "docker_image" {
		t.Fatalf("docker_image with include_memory: %v", err)
	}
	if _, err := e.m.StopSandbox(as(member), "b"); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.CaptureSnapshot(as(member), "b", protocol.CaptureSnapshotRequest{Name: "s", DockerImage: "x:1"})
	if !errors.As(err, &fe) || fe.Field != "docker_image" {
		t.Fatalf("docker_image from a stopped sandbox: %v", err)
	}
}
