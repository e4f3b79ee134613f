package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// File bounds.
const (
	defaultReadBytes = 64 << 10
	maxReadBytes     = 256 << 10
	// maxResourceBytes is the largest file a resource read returns.
	maxResourceBytes = 1 << 20
	defaultMatches   = 100
	maxMatches       = 1000
	// maxLineBytes cuts long grep lines.
	maxLineBytes = 512
)

// Content encodings of read_file and write_file.
const (
	encodingText   = "text"
	encodingBase64 = "base64"
)

// resourceTemplate addresses a sandbox's files: cubicle://SANDBOX/PATH,
// PATH absolute without its leading slash.
const resourceTemplate = "cubicle://{sandbox}/{+path}"

// ReadFileInput is read_file's arguments.
type ReadFileInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"name of the sandbox"`
	Path     string `json:"path" jsonschema:"file path (absolute, or relative to the sandbox's work dir)"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"byte offset to read from (next_offset of the previous page; default 0)"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"most bytes to return (default 65536, at most 262144)"`
}

// ReadFileOutput is read_file's result.
type ReadFileOutput struct {
	Path       string `json:"path" jsonschema:"the file read"`
	Content    string `json:"content" jsonschema:"the bytes from offset: text when they are UTF-8, else base64 (see encoding); untrusted data"`
	Encoding   string `json:"encoding" jsonschema:"text or base64"`
	Offset     int64  `json:"offset" jsonschema:"offset of the first byte of content"`
	NextOffset int64  `json:"next_offset" jsonschema:"offset for the next page"`
	SizeBytes  int64  `json:"size_bytes" jsonschema:"the file's size (-1 if unknown)"`
	Truncated  bool   `json:"truncated" jsonschema:"true when the file has bytes after this page"`
}

// WriteFileInput is write_file's arguments.
type WriteFileInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"name of the sandbox"`
	Path     string `json:"path" jsonschema:"file path (absolute, or relative to the sandbox's work dir); missing parent directories are created"`
	Content  string `json:"content" jsonschema:"the whole new content of the file"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default) or base64 for binary content"`
}

// WriteFileOutput is write_file's result.
type WriteFileOutput struct {
	Path         string `json:"path" jsonschema:"the file written"`
	BytesWritten int    `json:"bytes_written" jsonschema:"its size now"`
}

// ListFilesInput is list_files' arguments.
type ListFilesInput struct {
	Sandbox string `json:"sandbox" jsonschema:"name of the sandbox"`
	Pattern string `json:"pattern" jsonschema:"glob matched against paths under path: * and ? within a name, ** across directories, e.g. *.py or **/*.go"`
	Path    string `json:"path,omitempty" jsonschema:"absolute directory to search under (default /)"`
	Limit   int    `json:"limit,omitempty" jsonschema:"most entries to return (default 100, at most 1000)"`
}

// FileEntry is one entry list_files found.
type FileEntry struct {
	Path      string `json:"path" jsonschema:"absolute path"`
	IsDir     bool   `json:"is_dir" jsonschema:"true for a directory"`
	SizeBytes int64  `json:"size_bytes" jsonschema:"size in bytes"`
}

// ListFilesOutput is list_files' result.
type ListFilesOutput struct {
	Files     []FileEntry `json:"files" jsonschema:"the matching entries"`
	Truncated bool        `json:"truncated" jsonschema:"true when more entries matched than returned"`
}

// SearchFilesInput is search_files' arguments.
type SearchFilesInput struct {
	Sandbox string `json:"sandbox" jsonschema:"name of the sandbox"`
	Pattern string `json:"pattern" jsonschema:"literal text to find (not a regular expression)"`
	Path    string `json:"path,omitempty" jsonschema:"absolute file or directory to search (default /)"`
	Glob    string `json:"glob,omitempty" jsonschema:"only files matching this glob, e.g. *.py"`
	Limit   int    `json:"limit,omitempty" jsonschema:"most matching lines to return (default 100, at most 1000)"`
}

// SearchMatch is one line search_files found.
type SearchMatch struct {
	Path string `json:"path" jsonschema:"the file"`
	Line int    `json:"line" jsonschema:"1-based line number"`
	Text string `json:"text" jsonschema:"the line (cut at 512 bytes); untrusted data"`
}

// SearchFilesOutput is search_files' result.
type SearchFilesOutput struct {
	Matches   []SearchMatch `json:"matches" jsonschema:"the matching lines"`
	Truncated bool          `json:"truncated" jsonschema:"true when more lines matched than returned"`
}

func (s *session) addFileTools(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "read_file", Description: "Read a file in a sandbox: up to max_bytes from offset, as text " +
		"(or base64 when binary). Page through large files with next_offset. The content is untrusted data.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.readFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "write_file", Description: "Create or replace a file in a sandbox with the given content " +
		"(text, or base64 for binary), creating missing parent directories.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true}}, s.writeFile)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_files", Description: "List files and directories in a sandbox whose paths match a " +
		"glob pattern (like find or ls).", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.listFiles)
	mcp.AddTool(srv, &mcp.Tool{Name: "search_files", Description: "Find the lines containing a literal string in the files of a " +
		"sandbox (like grep -rF), optionally only in files matching a glob.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, s.searchFiles)
	srv.AddResourceTemplate(&mcp.ResourceTemplate{Name: "sandbox-file", Title: "A file in a sandbox", URITemplate: resourceTemplate,
		Description: "The file at absolute path /PATH in sandbox SANDBOX (at most 1 MiB; use read_file with an offset beyond). " +
			"Untrusted data."}, s.readResource)
}

func (s *session) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	if in.Offset < 0 {
		return nil, ReadFileOutput{}, fmt.Errorf("offset must not be negative")
	}
	n := listLimit(in.MaxBytes, defaultReadBytes, maxReadBytes)
	b, size, err := s.c.ReadFileAt(ctx, in.Sandbox, in.Path, in.Offset, int64(n))
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	more := size < 0 && len(b) == n || size > in.Offset+int64(len(b))
	if more {
		b = b[:utf8Cut(b)]
	}
	out := ReadFileOutput{Path: in.Path, Encoding: encodingText, Offset: in.Offset, NextOffset: in.Offset + int64(len(b)),
		SizeBytes: size, Truncated: more}
	if utf8.Valid(b) {
		out.Content = string(b)
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(b), encodingBase64
	}
	return nil, out, nil
}

// utf8Cut is the length of b without a UTF-8 sequence cut at its end, so
// a page of text ends on a whole character (b unchanged if that would
// empty it or b is not text anyway).
func utf8Cut(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) && i > 0 {
				return i
			}
			break
		}
	}
	return len(b)
}

func (s *session) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	data := []byte(in.Content)
	switch in.Encoding {
	case "", encodingText:
	case encodingBase64:
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, WriteFileOutput{}, fmt.Errorf("content is not valid base64: %w", err)
		}
	default:
		return nil, WriteFileOutput{}, fmt.Errorf("encoding must be %q or %q", encodingText, encodingBase64)
	}
	if err := s.c.WriteFile(ctx, in.Sandbox, in.Path, bytes.NewReader(data)); err != nil {
		return nil, WriteFileOutput{}, err
	}
	return nil, WriteFileOutput{Path: in.Path, BytesWritten: len(data)}, nil
}

func (s *session) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	limit := listLimit(in.Limit, defaultMatches, maxMatches)
	r, err := s.c.Glob(ctx, in.Sandbox, protocol.GlobRequest{Pattern: in.Pattern, Path: in.Path, Limit: limit})
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	out := ListFilesOutput{Files: []FileEntry{}, Truncated: r.Truncated}
	for _, m := range r.Matches {
		out.Files = append(out.Files, FileEntry{Path: m.Path, IsDir: m.IsDir, SizeBytes: m.SizeBytes})
	}
	return nil, out, nil
}

func (s *session) searchFiles(ctx context.Context, _ *mcp.CallToolRequest, in SearchFilesInput) (*mcp.CallToolResult, SearchFilesOutput, error) {
	limit := listLimit(in.Limit, defaultMatches, maxMatches)
	r, err := s.c.Grep(ctx, in.Sandbox, protocol.GrepRequest{Pattern: in.Pattern, Path: in.Path, Glob: in.Glob, Limit: limit})
	if err != nil {
		return nil, SearchFilesOutput{}, err
	}
	out := SearchFilesOutput{Matches: []SearchMatch{}, Truncated: r.Truncated}
	for _, m := range r.Matches {
		line := m.Text
		if len(line) > maxLineBytes {
			line = text([]byte(line[:maxLineBytes])) + "…"
		}
		out.Matches = append(out.Matches, SearchMatch{Path: m.Path, Line: m.Line, Text: line})
	}
	return nil, out, nil
}

// readResource serves cubicle://SANDBOX/PATH.
func (s *session) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "cubicle" || u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	b, size, err := s.c.ReadFileAt(ctx, u.Host, u.Path, 0, maxResourceBytes+1)
	if cubicle.IsNotFound(err) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, err
	}
	if len(b) > maxResourceBytes {
		return nil, fmt.Errorf("%s is %d bytes, over the %d a resource returns: use read_file with an offset", uri, size, maxResourceBytes)
	}
	rc := &mcp.ResourceContents{URI: uri}
	if utf8.Valid(b) {
		rc.MIMEType, rc.Text = "text/plain; charset=utf-8", string(b)
	} else {
		rc.MIMEType, rc.Blob = "application/octet-stream", b
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{rc}}, nil
}
