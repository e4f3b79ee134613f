package api

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/authz"
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

// loadImage stores a `docker save` tarball or OCI archive sent as the raw
// request body in the caller's workspace (`cubicle image load`). Its names
// are the workspace's own; other workspaces never resolve them. Naming
// images for the whole workspace is for admins (authz.LoadImages).
func (s *Server) loadImage(w http.ResponseWriter, r *http.Request) {
	p, err := admin(r, authz.LoadImages)
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
	writeJSON(w, http.StatusOK, imageList{Images: imageInfos(imgs)})
}

// imageList is the body of GET /images and POST /images/load.
type imageList struct {
	Images []ImageInfo `json:"images"`
	// UsageBytes is what the workspace's images occupy, each layer once
	// (GET only).
	UsageBytes *int64 `json:"usage_bytes,omitempty"`
}

// listImages lists the images the caller's workspace may use, and what they
// occupy (usage_bytes: each layer once, to be counted against its storage
// quota).
func (s *Server) listImages(r *http.Request, _ none) (imageList, error) {
	ws := caller(r).WorkspaceID
	imgs, err := s.images.List(r.Context(), ws)
	if err != nil {
		return imageList{}, err
	}
	usage, err := s.images.Usage(r.Context(), ws)
	if err != nil {
		return imageList{}, err
	}
	return imageList{Images: imageInfos(imgs), UsageBytes: &usage}, nil
}

// imageRemoval is the answer of DELETE /images/{ref...}.
type imageRemoval struct {
	Removed     string `json:"removed"`
	FreedImages int    `json:"freed_images"`
	FreedLayers int    `json:"freed_layers"`
	FreedBytes  int64  `json:"freed_bytes"`
}

// removeImage is DELETE /images/{ref...} (`cubicle image rm`, admins
// only: authz.RemoveImages): it drops the workspace's name (or, for a bare
// digest, every name of that image), then collects the layers no image and
// no snapshot uses any more.
func (s *Server) removeImage(r *http.Request, _ none) (imageRemoval, error) {
	p, err := admin(r, authz.RemoveImages)
	if err != nil {
		return imageRemoval{}, err
	}
	ref := r.PathValue("ref")
	if err := s.images.Remove(r.Context(), p.WorkspaceID, ref); err != nil {
		return imageRemoval{}, err
	}
	res, err := s.collectImages(r.Context())
	if err != nil {
		return imageRemoval{}, err
	}
	return imageRemoval{Removed: ref, FreedImages: res.Images, FreedLayers: res.Layers, FreedBytes: res.Bytes}, nil
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
