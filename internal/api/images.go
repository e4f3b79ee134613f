package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
)

// ImageInfo describes an image in the local store (a Cubicle extension).
type ImageInfo struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

func imageInfos(imgs []*image.Image) []ImageInfo {
	out := make([]ImageInfo, len(imgs))
	for i, img := range imgs {
		out[i] = ImageInfo{Ref: img.Ref, Digest: img.Digest, Size: img.Size}
	}
	return out
}

// imageAdmin returns the caller's principal if it administers its
// workspace: loading and removing images names them for the whole
// workspace.
func imageAdmin(r *http.Request, what string) (auth.Principal, error) {
	p, _ := auth.FromContext(r.Context())
	if !p.IsAdmin() {
		return p, fmt.Errorf("%s images needs an admin key: %w", what, errdefs.ErrForbidden)
	}
	return p, nil
}

// loadImage stores a `docker save` tarball or OCI archive sent as the raw
// request body in the caller's workspace (`cubicle image load`). Its names
// are the workspace's own; other workspaces never resolve them.
func (s *Server) loadImage(w http.ResponseWriter, r *http.Request) {
	p, err := imageAdmin(r, "loading")
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	imgs, err := s.images.LoadReader(r.Context(), p.WorkspaceID, r.Body, r.URL.Query().Get("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	for _, img := range imgs {
		img.Release()
	}
	writeJSON(w, http.StatusOK, map[string]any{"images": imageInfos(imgs)})
}

// listImages lists the images the caller's workspace may use, and what they
// occupy (usage_bytes: each layer once, to be counted against its storage
// quota).
func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	p, _ := auth.FromContext(r.Context())
	imgs, err := s.images.List(r.Context(), p.WorkspaceID)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	usage, err := s.images.Usage(r.Context(), p.WorkspaceID)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"images": imageInfos(imgs), "usage_bytes": usage})
}

// removeImage is DELETE /images/{ref...} (`cubicle image rm`): it drops the
// workspace's name (or, for a bare digest, every name of that image), then
// collects the layers no image and no snapshot uses any more.
func (s *Server) removeImage(w http.ResponseWriter, r *http.Request) {
	p, err := imageAdmin(r, "removing")
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	ref := r.PathValue("ref")
	if err := s.images.Remove(r.Context(), p.WorkspaceID, ref); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	res, err := s.collectImages(r.Context())
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"removed": ref, "freed_images": res.Images, "freed_layers": res.Layers, "freed_bytes": res.Bytes})
}

// collectImages frees image records and layers that no workspace's name
// and no snapshot use.
func (s *Server) collectImages(ctx context.Context) (image.GCResult, error) {
	inUse, err := s.mgr.LayersInUse(ctx)
	if err != nil {
		return image.GCResult{}, err
	}
	return s.images.GC(ctx, inUse)
}
