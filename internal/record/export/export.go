// Package export sends a daemon's audit record to systems outside it, so a
// SIEM can ingest it: a size-rotated JSON Lines file (JSONL) and
// OpenTelemetry logs over OTLP/HTTP (OTel). Both implement
// record.Exporter and see each event once, after it is written to the
// store.
//
// Every exported event is protocol.AuditEvent in its JSON form, the same
// object GET …/boxes/{name}/audit returns:
//
//	{"seq":12,"time":"2026-12-01T15:04:05.123Z","sandbox_id":"…","workspace_id":"…",
//	 "actor":{"user":"…","key_prefix":"…"},"kind":"network","type":"network.http",
//	 "step":11,"data":{…}}
package export

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Rotation defaults of a JSONL export: 5 files of 100 MiB at most (the
// live one and 4 rotated).
const (
	DefaultMaxMiB = 100
	DefaultFiles  = 5
)

// JSONL writes one event per line to a file, rotating it when the next
// line would take it past MaxMiB: the file is renamed with a timestamp
// (path-2026-12-01T15-04-05.000.jsonl) and a new one started; only the
// newest Files-1 rotated files are kept.
type JSONL struct {
	mu  sync.Mutex
	w   *lumberjack.Logger
	buf []byte
	log *slog.Logger
}

var _ record.Exporter = (*JSONL)(nil)

// NewJSONL exports to path, rotating at maxMiB and keeping files files in
// all (both at least 1).
func NewJSONL(path string, maxMiB, files int, log *slog.Logger) (*JSONL, error) {
	if path == "" {
		return nil, fmt.Errorf("audit export: jsonl needs a path: %w", errdefs.ErrInvalid)
	}
	if maxMiB < 1 || files < 1 {
		return nil, fmt.Errorf("audit export: rotation of %d MiB × %d files: %w", maxMiB, files, errdefs.ErrInvalid)
	}
	if log == nil {
		log = slog.Default()
	}
	w := &lumberjack.Logger{Filename: path, MaxSize: maxMiB, MaxBackups: files - 1, LocalTime: false}
	return &JSONL{w: w, log: log}, nil
}

// Export writes evs, one line each (a line is never split across files).
func (j *JSONL) Export(evs []protocol.AuditEvent) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range evs {
		b, err := json.Marshal(&evs[i])
		if err != nil {
			j.log.Error("audit export: encode event", "seq", evs[i].Seq, "err", err)
			continue
		}
		j.buf = append(append(j.buf[:0], b...), '\n')
		if _, err := j.w.Write(j.buf); err != nil {
			j.log.Error("audit export: write", "file", j.w.Filename, "err", err)
		}
	}
}

// Close closes the file.
func (j *JSONL) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.w.Close()
}

// ParseTarget reads an --audit-export value: "jsonl:PATH".
func ParseTarget(s string) (kind, path string, err error) {
	kind, path, ok := strings.Cut(s, ":")
	if !ok || kind != "jsonl" || path == "" {
		return "", "", errdefs.Field("--audit-export", "%q: want jsonl:PATH", s)
	}
	return kind, path, nil
}
