package api

import (
	"mime"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// maxDownloadTTL bounds a download link's expires_in_seconds (about ten
// years; the protocol's "never" is leaving the field out).
const maxDownloadTTL = 10 * 365 * 24 * time.Hour

// downloadURL mints a download link (spec X2): a URL that needs no other
// credential and is pinned, by its signed token, to one sandbox, one path,
// and the content type and disposition asked for.
func (s *Server) downloadURL(r *http.Request, req protocol.DownloadURLRequest) (protocol.DownloadURLResponse, error) {
	ttl, err := validateDownloadURL(req)
	if err != nil {
		return protocol.DownloadURLResponse{}, err
	}
	sb, err := s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		return protocol.DownloadURLResponse{}, err
	}
	l, err := s.gw.IssueDownload(r.Context(), sb, req.Path, req.ContentType, req.ContentDisposition, ttl)
	if err != nil {
		return protocol.DownloadURLResponse{}, err
	}
	resp := protocol.DownloadURLResponse{DownloadURL: l.URL, Token: l.Token}
	if !l.ExpiresAt.IsZero() {
		at := l.ExpiresAt.Format(time.RFC3339)
		resp.ExpiresAt = &at
	}
	return resp, nil
}

// validateDownloadURL checks a download-url request and returns the link's
// lifetime (0: never expires).
func validateDownloadURL(req protocol.DownloadURLRequest) (time.Duration, error) {
	if req.Path == "" {
		return 0, errdefs.Field("path", "is required")
	}
	if !strings.HasPrefix(req.Path, "/") || strings.ContainsRune(req.Path, 0) {
		return 0, errdefs.Field("path", "must be an absolute path without NUL")
	}
	if req.ContentType != "" {
		// A parsable media type cannot smuggle header syntax (CR, LF).
		if _, _, err := mime.ParseMediaType(req.ContentType); err != nil || strings.ContainsAny(req.ContentType, "\r\n") {
			return 0, errdefs.Field("content_type", "must be a media type such as text/plain; charset=utf-8")
		}
	}
	switch req.ContentDisposition {
	case "", protocol.DispositionAttachment, protocol.DispositionInline:
	default:
		return 0, errdefs.Field("content_disposition", "must be %q or %q", protocol.DispositionAttachment, protocol.DispositionInline)
	}
	if req.ExpiresInSeconds == nil {
		return 0, nil
	}
	ttl := time.Duration(*req.ExpiresInSeconds) * time.Second
	if *req.ExpiresInSeconds < 1 || ttl > maxDownloadTTL {
		return 0, errdefs.Field("expires_in_seconds", "must be between 1 and %d", int64(maxDownloadTTL/time.Second))
	}
	return ttl, nil
}

// downloadLink serves GET and HEAD on a download link (spec §9.3), with
// Range and conditional requests, waking a stopped sandbox. The token is
// the only credential and names everything: any query is ignored, so a
// link for one path cannot read another.
func (s *Server) downloadLink(w http.ResponseWriter, r *http.Request) {
	c, err := s.gw.VerifyDownload(r.PathValue("token"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	dp, err := s.mgr.GrantDataplane(sandbox.WithRequestKind(r.Context(), "download_link"), c.Workspace, c.Sandbox)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	defer dp.Release()
	extra := http.Header{}
	if c.ContentType != "" {
		extra.Set("Content-Type", c.ContentType)
	}
	if c.Disposition != "" {
		cd := mime.FormatMediaType(c.Disposition, map[string]string{"filename": path.Base(c.Path)})
		if cd == "" {
			cd = c.Disposition
		}
		extra.Set("Content-Disposition", cd)
	}
	// The link serves sandbox-controlled bytes from the daemon's origin:
	// no sniffing, and an inline HTML file runs in an opaque origin.
	extra.Set("X-Content-Type-Options", "nosniff")
	extra.Set("Content-Security-Policy", "sandbox")
	extra.Set("Referrer-Policy", "no-referrer")
	extra.Set("Cache-Control", "private")
	s.relayRecorded(w, r, c.Sandbox, dp, c.Path, "link", extra)
}
