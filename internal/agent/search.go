package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Search limits: results are capped and the walk stops at a deadline;
// either sets Truncated.
const (
	defaultSearchLimit = 1000
	maxSearchLimit     = 100000
	searchDeadline     = 10 * time.Second
	maxGrepLine        = 2000    // bytes of a matching line returned
	maxScanLine        = 4 << 20 // longer lines end the scan of that file
	binarySniff        = 8000
	// MaxSearchBytes bounds the JSON of one glob or grep answer: matches
	// past it are left out and the result marked truncated. The daemon
	// reads no more than this (plus slack) from an agent.
	MaxSearchBytes = 16 << 20
	// matchOverhead is a match's JSON beyond its path and text, rounded up.
	matchOverhead = 128
)

// GlobRequest is the body of POST /v1/glob (spec D7). Pattern is matched
// against each entry's path relative to Path; "**" spans any number of
// segments, "*", "?" and "[...]" stay within one.
type GlobRequest struct {
	Pattern string `json:"pattern"`
	Path    string `json:"path"`
	Limit   int    `json:"limit,omitempty"`
	// User is who the search runs as (the sandbox's run_config.user).
	User string `json:"user,omitempty"`
}

// The answers are the wire types the daemon relays unchanged.
type (
	GlobMatch  = protocol.GlobMatch
	GlobResult = protocol.GlobResult
	GrepMatch  = protocol.GrepMatch
	GrepResult = protocol.GrepResult
)

// GrepRequest is the body of POST /v1/grep (spec D8). Pattern is a literal
// string. Glob filters files: without "/" or "**" it matches the base name
// at any depth, otherwise the path relative to Path.
type GrepRequest struct {
	Pattern string `json:"pattern"`
	Path    string `json:"path"`
	Glob    string `json:"glob,omitempty"`
	Limit   int    `json:"limit,omitempty"`
	User    string `json:"user,omitempty"`
}

// errStopWalk ends a walk early once a limit or the deadline is hit.
var errStopWalk = errors.New("stop walk")

// pseudoFS are kernel filesystems a search never descends into.
var pseudoFS = map[string]bool{"/proc": true, "/sys": true, "/dev": true}

func (s *Server) handleGlob(w http.ResponseWriter, r *http.Request) {
	var req GlobRequest
	root, id, ok := s.decodeSearch(w, r, &req, &req.Path, &req.User)
	if !ok {
		return
	}
	if req.Pattern == "" {
		req.Pattern = "*"
	}
	pat := strings.Split(strings.Trim(req.Pattern, "/"), "/")
	res := GlobResult{Matches: []GlobMatch{}}
	caps := newSearchCaps(r.Context(), req.Limit)
	defer caps.cancel()
	err := asUser(id, func() error {
		return walk(caps.ctx, root, func(p string, rel []string, d fs.DirEntry) error {
			if matchGlob(pat, rel) {
				if !caps.take(len(p)) {
					return errStopWalk
				}
				m := GlobMatch{Path: p, IsDir: d.IsDir()}
				if info, err := d.Info(); err == nil {
					mt := info.ModTime().UTC()
					m.SizeBytes, m.ModifiedAt = info.Size(), &mt
				}
				res.Matches = append(res.Matches, m)
			}
			if d.IsDir() && !matchPrefix(pat, rel) {
				return fs.SkipDir
			}
			return nil
		})
	})
	res.Truncated = caps.truncated(err)
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleGrep(w http.ResponseWriter, r *http.Request) {
	var req GrepRequest
	root, id, ok := s.decodeSearch(w, r, &req, &req.Path, &req.User)
	if !ok {
		return
	}
	if req.Pattern == "" {
		writeError(w, http.StatusBadRequest, errKindInvalid, "pattern is required")
		return
	}
	var glob []string
	baseOnly := req.Glob != "" && !strings.Contains(req.Glob, "/") && !strings.Contains(req.Glob, "**")
	if req.Glob != "" && !baseOnly {
		glob = strings.Split(strings.Trim(req.Glob, "/"), "/")
	}
	res := GrepResult{Matches: []GrepMatch{}}
	caps := newSearchCaps(r.Context(), req.Limit)
	defer caps.cancel()
	needle := []byte(req.Pattern)
	err := asUser(id, func() error {
		return walk(caps.ctx, root, func(p string, rel []string, d fs.DirEntry) error {
			if !d.Type().IsRegular() {
				return nil
			}
			if baseOnly {
				if ok, _ := path.Match(req.Glob, d.Name()); !ok {
					return nil
				}
			} else if glob != nil && len(rel) > 0 && !matchGlob(glob, rel) {
				return nil
			}
			return grepFile(p, needle, caps, &res)
		})
	})
	res.Truncated = caps.truncated(err)
	writeJSON(w, http.StatusOK, res)
}

// searchCaps are one search's limits: a match count, a byte budget for the
// answer (MaxSearchBytes) and the deadline.
type searchCaps struct {
	ctx    context.Context
	cancel context.CancelFunc
	left   int // matches still allowed
	bytes  int // answer bytes still allowed
	hit    bool
}

func newSearchCaps(ctx context.Context, limit int) *searchCaps {
	c := &searchCaps{left: searchLimit(limit), bytes: MaxSearchBytes}
	c.ctx, c.cancel = context.WithTimeout(ctx, searchDeadline)
	return c
}

// take admits one more match of n bytes of path and text, or records that
// a cap was hit.
func (c *searchCaps) take(n int) bool {
	if c.left == 0 || c.bytes < n+matchOverhead {
		c.hit = true
		return false
	}
	c.left--
	c.bytes -= n + matchOverhead
	return true
}

// truncated reports whether a cap or the deadline cut the search short.
func (c *searchCaps) truncated(err error) bool {
	return c.hit || errors.Is(err, context.DeadlineExceeded)
}

// grepFile appends p's lines containing needle to res, skipping binary
// files; it returns errStopWalk once a cap is hit. The file is opened
// without following a symlink swapped in since the directory was read.
func grepFile(p string, needle []byte, caps *searchCaps, res *GrepResult) error {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil // unreadable files are skipped, like grep -s
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	br := bufio.NewReaderSize(f, 64<<10)
	if head, _ := br.Peek(binarySniff); bytes.IndexByte(head, 0) >= 0 {
		return nil
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 64<<10), maxScanLine)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if !bytes.Contains(b, needle) {
			continue
		}
		b = bytes.TrimSuffix(b, []byte("\r"))
		if len(b) > maxGrepLine {
			b = b[:completePrefix(b[:maxGrepLine])]
		}
		// Escaping can grow text up to 6×; count it so.
		if !caps.take(len(p) + 6*len(b)) {
			return errStopWalk
		}
		res.Matches = append(res.Matches, GrepMatch{Path: p, Line: line, Text: strings.ToValidUTF8(string(b), string(utf8.RuneError))})
	}
	return nil
}

// decodeSearch decodes a glob or grep body, resolves who it runs as and
// checks its root path as that user, answering the error itself when it
// returns false.
func (s *Server) decodeSearch(w http.ResponseWriter, r *http.Request, req any, p, user *string) (string, identity, bool) {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(req); err != nil {
		writeError(w, http.StatusBadRequest, errKindInvalid, "invalid body: "+err.Error())
		return "", identity{}, false
	}
	if *p == "" {
		*p = "/"
	}
	root, _ := cleanPath(*p, "/")
	id, err := lookupIdentity(s.root, *user)
	if err != nil {
		writeError(w, http.StatusBadRequest, errKindInvalid, "run_config.user: "+err.Error())
		return "", identity{}, false
	}
	if _, err := statAs(id, root); err != nil {
		writeFSError(w, errKindReadError, root, err)
		return "", identity{}, false
	}
	return root, id, true
}

func searchLimit(n int) int {
	switch {
	case n <= 0:
		return defaultSearchLimit
	case n > maxSearchLimit:
		return maxSearchLimit
	default:
		return n
	}
}

// walk visits every entry under root (root itself only when it is not a
// directory, with rel empty), never entering kernel pseudo-filesystems other
// than root. fn may return fs.SkipDir or errStopWalk; walk returns ctx's
// error if the deadline cut it short.
func walk(ctx context.Context, root string, fn func(p string, rel []string, d fs.DirEntry) error) error {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return nil // unreadable entries are skipped
		}
		if p == root {
			if d.IsDir() {
				return nil
			}
			return fn(p, nil, d)
		}
		if d.IsDir() && pseudoFS[p] {
			return fs.SkipDir
		}
		rel := strings.Split(strings.TrimPrefix(p[len(root):], "/"), "/")
		return fn(p, rel, d)
	})
	if errors.Is(err, errStopWalk) {
		return nil
	}
	return err
}

// matchGlob reports whether the path segments name match the pattern
// segments pat, where "**" matches zero or more whole segments.
func matchGlob(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if matchGlob(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// matchPrefix reports whether some path below the directory name could match
// pat, i.e. whether the walk should descend into it.
func matchPrefix(pat, name []string) bool {
	for ; len(name) > 0; pat, name = pat[1:], name[1:] {
		if len(pat) == 0 {
			return false
		}
		if pat[0] == "**" {
			return true
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
	}
	return len(pat) > 0
}
