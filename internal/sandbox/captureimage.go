package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// A capture with docker_image does not take the sandbox's filesystem: it
// exports the named image from the Docker daemon running inside the
// sandbox (`docker save`, as root) and loads the archive as any uploaded
// image is loaded (internal/image), so the snapshot is that image's
// layers and config, as if it had been pulled. This is what the official
// clients' createSnapshotFromDockerfile calls after BuildKit has built
// the image into the builder sandbox's Docker. The snapshot is building
// until the export is loaded, then ready or failed with docker's output.

// execer runs one command in a sandbox (agent.Client).
type execer interface {
	Exec(ctx context.Context, req protocol.ExecFrame, stdout, stderr io.Writer) (int, error)
}

// exportTimeout bounds one image export from a sandbox.
const exportTimeout = 30 * time.Minute

// captureImage records a building snapshot of image req.DockerImage from
// ready sandbox sb's Docker and exports it in the background.
func (m *Manager) captureImage(ctx context.Context, workspaceID, user string, sb *store.Sandbox, req protocol.CaptureSnapshotRequest) (*SnapshotView, error) {
	if !sb.Docker {
		return nil, errdefs.Field("docker_image", "sandbox %s does not run Docker inside: export images from a sandbox created with docker: true (or from the docker snapshot)", sb.Name)
	}
	if statusOf(sb) != Ready {
		return nil, errdefs.Field("docker_image", "sandbox %s is %s: its Docker must be running to export an image; start it", sb.Name, sb.Status)
	}
	client, _ := m.instance(sb.ID)
	if client == nil {
		return nil, fmt.Errorf("sandbox %s has no agent: %w", sb.Name, errdefs.ErrNotReady)
	}
	tag, _ := snapshotTag(req.Tag) // checked by validateCaptureRequest
	now := time.Now().UTC()
	sn := &store.Snapshot{
		ID: uuid.NewString(), WorkspaceID: workspaceID, CreatedBy: user, Name: req.Name, Tag: tag, Labels: req.Labels,
		Status: protocol.SnapshotBuilding, DockerImage: req.DockerImage, SourceSandboxID: sb.ID,
		FSCapacityBytes: or(req.FSCapacityBytes, sb.FSCapacityBytes), CreatedAt: now, UpdatedAt: now,
	}
	if err := m.quota.admit(ctx, workspaceID, snapshotClaim, func() error {
		return m.cfg.Store.CreateSnapshot(ctx, sn)
	}); err != nil {
		return nil, err
	}
	ref := req.DockerImage
	m.runBuild(ctx, sn, req.RunConfig, func(ctx context.Context, bp *buildProgress) (*image.Image, error) {
		bp.setStep("exporting "+ref+" from sandbox "+sb.Name, 0)
		return m.exportImage(ctx, client, workspaceID, ref)
	})
	m.log.Info("exporting image from sandbox", "snapshot", sn.ID, "name", sn.Name, "sandbox", sb.ID, "image", ref)
	return &SnapshotView{Snapshot: sn}, nil
}

// exportImage streams `docker save ref` from the sandbox behind client
// into workspace ws's image store and returns the image (the caller
// releases it).
func (m *Manager) exportImage(ctx context.Context, client execer, ws, ref string) (*image.Image, error) {
	ctx, cancel := context.WithTimeout(ctx, exportTimeout)
	defer cancel()
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	exited := make(chan error, 1)
	go func() {
		secs := int64(exportTimeout / time.Second)
		code, err := client.Exec(ctx, protocol.ExecFrame{Command: "exec docker save -- " + shellQuote(ref), Shell: "/bin/sh",
			RunConfig: &protocol.RunConfig{User: "root", WorkDir: "/"}, CloseStdin: true, Encoding: protocol.EncodingBase64,
			TimeoutSeconds: &secs}, pw, &stderr)
		if err == nil && code != 0 {
			err = fmt.Errorf("docker save %s exited %d: %s", ref, code, tail(stderr.String(), 1024))
		}
		pw.CloseWithError(err)
		exited <- err
	}()
	imgs, err := m.cfg.Images.LoadReader(ctx, ws, pr, "")
	pr.CloseWithError(io.ErrClosedPipe) // the exec ends if the load gave up early
	if xerr := <-exited; xerr != nil {
		for _, img := range imgs {
			img.Release()
		}
		return nil, fmt.Errorf("export image %s from the sandbox: %w", ref, xerr)
	}
	if err != nil {
		return nil, fmt.Errorf("export image %s from the sandbox: %w", ref, err)
	}
	for _, extra := range imgs[1:] {
		extra.Release()
	}
	if strings.TrimSpace(stderr.String()) != "" {
		m.log.Debug("docker save", "image", ref, "stderr", tail(stderr.String(), 1024))
	}
	return imgs[0], nil
}
