package api

import (
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Dockerfile builds (protocol.BuildSnapshotRequest): POST /snapshots with
// a build context body, and GET /snapshots/{id}/build-log.

const (
	contentTar       = "application/x-tar"
	contentMultipart = "multipart/form-data"
)

// postSnapshots answers POST /snapshots: a Dockerfile build when the body
// is a build context (a tar, or multipart with one), else the protocol's
// JSON create.
func (s *Server) postSnapshots() http.HandlerFunc {
	create := jsonHandler(http.StatusCreated, nil, gated(s, s.createSnapshot))
	return func(w http.ResponseWriter, r *http.Request) {
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if mt != contentTar && mt != contentMultipart {
			create(w, r)
			return
		}
		if err := s.admitWrite(r.Context()); err != nil {
			writeError(r.Context(), w, err)
			return
		}
		req, body, err := buildRequest(r, mt)
		if err != nil {
			writeError(r.Context(), w, err)
			return
		}
		v, err := s.mgr.BuildSnapshot(r.Context(), req, body)
		if err != nil {
			writeError(r.Context(), w, err)
			return
		}
		writeJSON(w, http.StatusCreated, s.snapshotJSON(v))
	}
}

// buildRequest reads a build's fields — the query of a tar body, or the
// form fields of a multipart body before its "context" file — and
// returns the context's reader (an empty context when none is sent).
func buildRequest(r *http.Request, mt string) (protocol.BuildSnapshotRequest, io.Reader, error) {
	if mt == contentTar {
		req, err := buildFields(r.URL.Query())
		return req, r.Body, err
	}
	mr, err := r.MultipartReader()
	if err != nil {
		return protocol.BuildSnapshotRequest{}, nil, errdefs.Field("body", "multipart: %v", err)
	}
	fields := url.Values{}
	var body io.Reader = strings.NewReader("")
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return protocol.BuildSnapshotRequest{}, nil, errdefs.Field("body", "multipart: %v", err)
		}
		if part.FormName() == "context" {
			body = part // the context streams: fields after it are not read
			break
		}
		v, err := io.ReadAll(io.LimitReader(part, maxBody+1))
		if err != nil || len(v) > maxBody {
			return protocol.BuildSnapshotRequest{}, nil, errdefs.Field(part.FormName(), "over %d bytes, or unreadable", maxBody)
		}
		fields.Add(part.FormName(), string(v))
	}
	req, err := buildFields(fields)
	return req, body, err
}

// buildFields decodes a build's fields; unknown ones are refused, as the
// JSON decoder refuses unknown members.
func buildFields(v url.Values) (protocol.BuildSnapshotRequest, error) {
	var req protocol.BuildSnapshotRequest
	for k, vals := range v {
		one := vals[len(vals)-1]
		switch k {
		case "name":
			req.Name = one
		case "tag":
			req.Tag = one
		case "dockerfile":
			req.Dockerfile = one
		case "target":
			req.Target = one
		case "start_cmd":
			req.StartCmd = one
		case "ready_cmd":
			req.ReadyCmd = one
		case "no_cache":
			b, err := strconv.ParseBool(one)
			if err != nil {
				return req, errdefs.Field("no_cache", "must be true or false")
			}
			req.NoCache = b
		case "fs_capacity_bytes":
			n, err := strconv.ParseInt(one, 10, 64)
			if err != nil {
				return req, errdefs.Field("fs_capacity_bytes", "must be an integer")
			}
			req.FSCapacityBytes = n
		case "build_arg":
			req.BuildArgs = map[string]string{}
			for _, kv := range vals {
				key, val, ok := strings.Cut(kv, "=")
				if !ok || key == "" {
					return req, errdefs.Field("build_arg", "%q: want KEY=VALUE", kv)
				}
				req.BuildArgs[key] = val
			}
		default:
			return req, errdefs.Field(k, "unknown field of a Dockerfile build")
		}
	}
	return req, nil
}

// buildLog streams GET /snapshots/{id}/build-log: the step log as plain
// text, followed live until the build ends.
func (s *Server) buildLog(w http.ResponseWriter, r *http.Request) {
	log, err := s.mgr.BuildLog(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	ctx, cancel := cancelOn(r.Context(), s.draining)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	log.Follow(ctx, w, func() { rc.Flush() })
}
