package api

import (
	"fmt"
	"io"
	"net/http"
	"os"

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

// loadImage stores a `docker save` tarball or OCI archive sent as the raw
// request body in the local image store (`cubicle image load`). The store is
// shared by every workspace, so only admins may write to it.
func (s *Server) loadImage(w http.ResponseWriter, r *http.Request) {
	if p, _ := auth.FromContext(r.Context()); !p.IsAdmin() {
		writeError(r.Context(), w, fmt.Errorf("loading images needs an admin key: %w", errdefs.ErrForbidden))
		return
	}
	tmp, err := os.CreateTemp("", "cubicle-load-*.tar")
	if err != nil {
		writeError(r.Context(), w, fmt.Errorf("buffer image archive: %w", err))
		return
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := io.Copy(tmp, r.Body); err != nil {
		writeError(r.Context(), w, fmt.Errorf("receive image archive: %w", err))
		return
	}
	imgs, err := s.images.Load(r.Context(), tmp.Name(), r.URL.Query().Get("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"images": imageInfos(imgs)})
}

// listImages lists the local image store.
func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := s.images.List(r.Context())
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"images": imageInfos(imgs)})
}
