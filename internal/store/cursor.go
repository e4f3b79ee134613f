package store

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// cursorPrefix marks an opaque keyset cursor, which never parses as the
// integer offsets older clients send as cursors.
const cursorPrefix = "k1."

// cursorBody is what an opaque cursor holds: the list and sort it was
// made for, and the position.
type cursorBody struct {
	Kind string `json:"k"`
	Sort string `json:"s"`
	Desc bool   `json:"d,omitempty"`
	Str  string `json:"v,omitempty"`
	Int  *int64 `json:"n,omitempty"`
	ID   string `json:"i"`
}

// EncodeCursor makes the opaque cursor of position c in list kind sorted
// by sortBy (desc reversed).
func EncodeCursor(kind, sortBy string, desc bool, c Cursor) string {
	b := cursorBody{Kind: kind, Sort: sortColumn(sortBy), Desc: desc, ID: c.ID}
	switch v := c.Value.(type) {
	case int64:
		b.Int = &v
	case string:
		b.Str = v
	}
	raw, _ := json.Marshal(b)
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(raw)
}

// DecodeCursor reads an opaque cursor for list kind sorted by sortBy
// (desc reversed); a cursor that is malformed or was made for another
// list or order is ErrInvalid.
func DecodeCursor(s, kind, sortBy string, desc bool) (*Cursor, error) {
	bad := fmt.Errorf("cursor: not a cursor this list returned with this sort_by and sort_order: %w", errdefs.ErrInvalid)
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(s, cursorPrefix))
	if !strings.HasPrefix(s, cursorPrefix) || err != nil {
		return nil, bad
	}
	var b cursorBody
	if err := json.Unmarshal(raw, &b); err != nil || b.Kind != kind || b.Sort != sortColumn(sortBy) || b.Desc != desc || b.ID == "" {
		return nil, bad
	}
	c := &Cursor{ID: b.ID, Value: b.Str}
	if b.Int != nil {
		c.Value = *b.Int
	}
	return c, nil
}

func sortColumn(col string) string {
	if col == "" {
		return "created_at"
	}
	return col
}

// SandboxCursor is sb's position in a list of sandboxes sorted by sortBy.
func SandboxCursor(sb *Sandbox, sortBy string) Cursor {
	c := Cursor{ID: sb.ID}
	switch sortColumn(sortBy) {
	case "updated_at":
		c.Value = fmtTime(sb.UpdatedAt)
	case "name":
		c.Value = sb.Name
	case "status":
		c.Value = sb.Status
	case "stopped_at":
		c.Value = ""
		if sb.StoppedAt != nil {
			c.Value = fmtTime(*sb.StoppedAt)
		}
	case "idle_ttl_seconds":
		c.Value = sb.IdleTTLSeconds
	case "delete_after_stop_seconds":
		c.Value = sb.DeleteAfterStopSeconds
	default:
		c.Value = fmtTime(sb.CreatedAt)
	}
	return c
}

// SnapshotCursor is sn's position in a list of snapshots sorted by sortBy.
func SnapshotCursor(sn *Snapshot, sortBy string) Cursor {
	c := Cursor{ID: sn.ID}
	switch sortColumn(sortBy) {
	case "updated_at":
		c.Value = fmtTime(sn.UpdatedAt)
	case "name":
		c.Value = sn.Name
	case "status":
		c.Value = sn.Status
	default:
		c.Value = fmtTime(sn.CreatedAt)
	}
	return c
}
