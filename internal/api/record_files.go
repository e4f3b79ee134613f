package api

import (
	"context"
	"io"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Transfers through the file API are file events of the record (step 0:
// no command made them).

// fileData is a file event's data.
type fileData struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
	// Status is a download's answer (200, 206 for a range).
	Status int `json:"status,omitempty"`
	// Via says how a download was asked for: "api" or "link".
	Via string `json:"via,omitempty"`
	// Door is the protocol the request came through (see DoorHeader).
	Door string `json:"door,omitempty"`
}

// recordFile records file event typ on sandboxID, when recording.
func (s *Server) recordFile(ctx context.Context, sandboxID, workspaceID, typ string, d fileData) {
	if s.rec == nil {
		return
	}
	d.Door = doorOf(ctx)
	s.rec.Record(context.WithoutCancel(ctx), record.Event{SandboxID: sandboxID, WorkspaceID: workspaceID,
		Kind: protocol.KindFile, Type: typ, Data: d})
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// relayRecorded is relayFile recording a successful GET as a download.
func (s *Server) relayRecorded(w http.ResponseWriter, r *http.Request, sandboxID string, dp *sandbox.Conn, path, via string, extra http.Header) {
	sw := &statusWriter{ResponseWriter: w}
	relayFile(sw, r, dp, path, extra)
	if r.Method == http.MethodGet && sw.status >= 200 && sw.status < 300 {
		s.recordFile(r.Context(), sandboxID, dp.WorkspaceID, protocol.EventFileDownloaded, fileData{Path: path, Bytes: sw.n, Status: sw.status, Via: via})
	}
}
