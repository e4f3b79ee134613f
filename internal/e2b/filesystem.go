package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cubicle-dev/cubicle/internal/e2b/envd/filesystem"
	"github.com/cubicle-dev/cubicle/internal/e2b/envd/filesystem/filesystemconnect"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// filesystemService is envd's filesystem.Filesystem over Cubicle's
// dataplane: listings and stats are globs (recorded as reads, not
// commands); making, moving and removing run mkdir, mv and rm in the
// sandbox, so they appear in its record as the commands they are.
// WatchDir polls listings: Cubicle has no change stream.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	d *Door
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// absPath resolves p as envd does: a relative path is under the user's
// home (the sandbox's work_dir when it has one is where Cubicle starts
// commands, but envd's rule is the home).
func (t *sandboxTarget) absPath(h http.Header, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	user := requestUser(h)
	if user == "" {
		user = t.user
	}
	home := "/root"
	if user != "" && user != "root" {
		home = "/home/" + user
	}
	return path.Join(home, p)
}

// globEscape makes name match only itself as a glob pattern.
func globEscape(name string) string {
	var b strings.Builder
	for _, r := range name {
		if strings.ContainsRune("*?[\\", r) {
			b.WriteString("[" + string(r) + "]")
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// entry maps a glob match.
func entry(m protocol.GlobMatch) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{Name: path.Base(m.Path), Path: m.Path, Size: m.SizeBytes, Type: filesystem.FileType_FILE_TYPE_FILE}
	if m.IsDir {
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
	}
	if m.ModifiedAt != nil {
		e.ModifiedTime = timestamppb.New(*m.ModifiedAt)
	}
	return e
}

// stat returns the entry at the absolute path p.
func (t *sandboxTarget) stat(ctx context.Context, p string) (*filesystem.EntryInfo, error) {
	if p == "/" {
		return &filesystem.EntryInfo{Name: "/", Path: "/", Type: filesystem.FileType_FILE_TYPE_DIRECTORY}, nil
	}
	res, err := t.c.Glob(ctx, t.name, protocol.GlobRequest{Path: path.Dir(p), Pattern: globEscape(path.Base(p))})
	if err != nil {
		return nil, err
	}
	for _, m := range res.Matches {
		if path.Clean(m.Path) == p {
			return entry(m), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s does not exist", p))
}

// list returns the entries under the directory p, at most depth levels
// down (0 is 1).
func (t *sandboxTarget) list(ctx context.Context, p string, depth int) ([]*filesystem.EntryInfo, error) {
	dir, err := t.stat(ctx, p)
	if err != nil {
		return nil, err
	}
	if dir.Type != filesystem.FileType_FILE_TYPE_DIRECTORY {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	pattern := "*"
	if depth > 1 {
		pattern = "**"
	}
	res, err := t.c.Glob(ctx, t.name, protocol.GlobRequest{Path: p, Pattern: pattern})
	if err != nil {
		return nil, err
	}
	out := []*filesystem.EntryInfo{}
	for _, m := range res.Matches {
		rel := strings.TrimPrefix(strings.TrimPrefix(path.Clean(m.Path), p), "/")
		if rel == "" || strings.Count(rel, "/") >= max(depth, 1) {
			continue
		}
		out = append(out, entry(m))
	}
	slices.SortFunc(out, func(a, b *filesystem.EntryInfo) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

// shell runs a file operation's command in the sandbox as the request's
// user; a non-zero exit is the command's stderr as an error.
func (t *sandboxTarget) shell(ctx context.Context, h http.Header, command string) error {
	res, err := t.c.RunRequest(ctx, t.name, protocol.ExecuteRequest{Command: command, Shell: "/bin/sh",
		RunConfig: &protocol.RunConfig{User: requestUser(h)}})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(res.Stderr)
		code := connect.CodeFailedPrecondition
		if strings.Contains(msg, "ermission denied") {
			code = connect.CodePermissionDenied
		}
		return connect.NewError(code, errors.New(msg))
	}
	return nil
}

// Stat describes one path.
func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return nil, rpcError(err)
	}
	e, err := t.stat(ctx, t.absPath(req.Header(), req.Msg.GetPath()))
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// ListDir lists a directory.
func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return nil, rpcError(err)
	}
	entries, err := t.list(ctx, t.absPath(req.Header(), req.Msg.GetPath()), int(req.Msg.GetDepth()))
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

// MakeDir creates a directory and its parents; one that exists is
// AlreadyExists (the SDKs answer false).
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return nil, rpcError(err)
	}
	p := t.absPath(req.Header(), req.Msg.GetPath())
	if _, err := t.stat(ctx, p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("path %s already exists", p))
	}
	if err := t.shell(ctx, req.Header(), "mkdir -p -- "+shellQuote(p)); err != nil {
		return nil, rpcError(err)
	}
	e, err := t.stat(ctx, p)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

// Move renames a path.
func (s *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return nil, rpcError(err)
	}
	src, dst := t.absPath(req.Header(), req.Msg.GetSource()), t.absPath(req.Header(), req.Msg.GetDestination())
	if _, err := t.stat(ctx, src); err != nil {
		return nil, rpcError(err)
	}
	if err := t.shell(ctx, req.Header(), "mv -- "+shellQuote(src)+" "+shellQuote(dst)); err != nil {
		return nil, rpcError(err)
	}
	e, err := t.stat(ctx, dst)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// Remove deletes a path, recursively.
func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return nil, rpcError(err)
	}
	p := t.absPath(req.Header(), req.Msg.GetPath())
	if _, err := t.stat(ctx, p); err != nil {
		return nil, rpcError(err)
	}
	if err := t.shell(ctx, req.Header(), "rm -rf -- "+shellQuote(p)); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// WatchDir streams changes under a directory: a start event, then create,
// write and remove events as successive listings differ.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return rpcError(err)
	}
	dir := t.absPath(req.Header(), req.Msg.GetPath())
	depth := 1
	if req.Msg.GetRecursive() {
		depth = 1 << 16
	}
	prev, err := t.list(ctx, dir, depth)
	if err != nil {
		return rpcError(err)
	}
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keep := keepalive(req.Header())
	defer keep.Stop()
	poll := time.NewTicker(s.d.pollEvery)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return rpcError(ctx.Err())
		case <-keep.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-poll.C:
			cur, err := t.list(ctx, dir, depth)
			if err != nil {
				return rpcError(err)
			}
			for _, ev := range changes(dir, prev, cur, req.Msg.GetIncludeEntry()) {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
			prev = cur
		}
	}
}

// changes are the events that turn listing prev of dir into cur: new
// paths are created, gone ones removed, and ones whose size or
// modification time moved written. Names are relative to dir.
func changes(dir string, prev, cur []*filesystem.EntryInfo, withEntry bool) []*filesystem.FilesystemEvent {
	before := map[string]*filesystem.EntryInfo{}
	for _, e := range prev {
		before[e.Path] = e
	}
	var out []*filesystem.FilesystemEvent
	add := func(e *filesystem.EntryInfo, typ filesystem.EventType) {
		ev := &filesystem.FilesystemEvent{Name: strings.TrimPrefix(strings.TrimPrefix(e.Path, dir), "/"), Type: typ}
		if withEntry && typ != filesystem.EventType_EVENT_TYPE_REMOVE {
			ev.Entry = e
		}
		out = append(out, ev)
	}
	for _, e := range cur {
		old, ok := before[e.Path]
		delete(before, e.Path)
		switch {
		case !ok:
			add(e, filesystem.EventType_EVENT_TYPE_CREATE)
		case old.Size != e.Size || !old.ModifiedTime.AsTime().Equal(e.ModifiedTime.AsTime()):
			add(e, filesystem.EventType_EVENT_TYPE_WRITE)
		}
	}
	for _, e := range prev {
		if _, gone := before[e.Path]; gone {
			add(e, filesystem.EventType_EVENT_TYPE_REMOVE)
		}
	}
	return out
}

// envdHTTP adapts an envd HTTP route: it resolves the sandbox and writes
// errors as envd does ({"code","message"} with the status the SDKs map).
func (d *Door) envdHTTP(h func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t, err := d.target(r.Context(), r.Header)
		if err == nil {
			err = h(w, r, t)
		}
		if err != nil {
			status := httpStatus(connect.CodeOf(rpcError(err)))
			writeJSON(w, status, &apiError{Code: status, Message: err.Error()})
		}
	}
}

// httpStatus is the envd HTTP status of an RPC code.
func httpStatus(code connect.Code) int {
	switch code {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusBadGateway // the SDKs read 502 as "sandbox gone"
	}
	return http.StatusInternalServerError
}

// download serves GET /files?path=: the file's bytes.
func (d *Door) download(w http.ResponseWriter, r *http.Request) {
	d.envdHTTP(func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) error {
		body, err := t.c.ReadFile(r.Context(), t.name, t.absPath(r.Header, r.URL.Query().Get("path")))
		if err != nil {
			return err
		}
		defer body.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.Copy(w, body)
		return nil
	})(w, r)
}

// writtenEntry is one entry of POST /files' answer.
type writtenEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// upload serves POST /files: a multipart form of "file" parts (each named
// by ?path= or, for several, by its filename) or, as application/
// octet-stream, one file at ?path= (gzip when Content-Encoding says so).
func (d *Door) upload(w http.ResponseWriter, r *http.Request) {
	d.envdHTTP(func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) error {
		query := r.URL.Query().Get("path")
		var out []writtenEntry
		put := func(p string, body io.Reader) error {
			if p == "" {
				return connect.NewError(connect.CodeInvalidArgument, errors.New("path: is required"))
			}
			p = t.absPath(r.Header, p)
			if err := t.c.WriteFile(r.Context(), t.name, p, body); err != nil {
				return err
			}
			out = append(out, writtenEntry{Name: path.Base(p), Type: "file", Path: p})
			return nil
		}
		mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if mt != "multipart/form-data" {
			body := io.Reader(r.Body)
			if r.Header.Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(r.Body)
				if err != nil {
					return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("gzip body: %w", err))
				}
				body = zr
			}
			if err := put(query, body); err != nil {
				return err
			}
		} else if err := eachPart(multipart.NewReader(r.Body, params["boundary"]), func(name string, part io.Reader) error {
			if query != "" {
				name = query
			}
			return put(name, part)
		}); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	})(w, r)
}

// eachPart calls fn for each "file" part of mr with its raw filename
// (Part.FileName would keep only its base).
func eachPart(mr *multipart.Reader, fn func(name string, part io.Reader) error) error {
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("multipart body: %w", err))
		}
		_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		if part.FormName() == "file" {
			if err := fn(params["filename"], part); err != nil {
				return err
			}
		}
		part.Close()
	}
}

// health serves GET /health: 204 while the sandbox runs, 502 when it does
// not (the SDKs' isRunning).
func (d *Door) health(w http.ResponseWriter, r *http.Request) {
	d.envdHTTP(func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) error {
		w.WriteHeader(http.StatusNoContent)
		return nil
	})(w, r)
}

// rpcError maps an error from the Cubicle API onto the Connect code the
// SDKs turn into their error classes (NotFound → NotFoundError,
// Unavailable → the sandbox-timeout error, DeadlineExceeded →
// TimeoutError, …).
func rpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	var nr *notRunningError
	var ae *cubicle.APIError
	var ee *cubicle.ExecError
	code := connect.CodeUnknown
	switch {
	case errors.Is(err, errNoSandbox):
		code = connect.CodeInvalidArgument
	case errors.As(err, &nr):
		code = connect.CodeUnavailable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, cubicle.ErrCommandTimeout):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.As(err, &ae):
		code = statusCode(ae.Status)
	case errors.As(err, &ee):
		code = connect.CodeInternal
	}
	return connect.NewError(code, err)
}

// statusCode is the RPC code of a Cubicle API status.
func statusCode(status int) connect.Code {
	switch status {
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusForbidden, http.StatusNotFound:
		return connect.CodeNotFound
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return connect.CodeInvalidArgument
	case http.StatusConflict:
		return connect.CodeFailedPrecondition
	case http.StatusTooManyRequests, http.StatusInsufficientStorage:
		return connect.CodeResourceExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}
