package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// keysetFixture is a workspace of 30 sandboxes of owners a and b
// interleaved, labelled team=x on every other one, some shared with b.
func keysetFixture(t *testing.T) (*SQLite, map[string]bool) {
	t.Helper()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	ctx := context.Background()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC().Add(-time.Hour)
	want := map[string]bool{} // b's visible sandboxes labelled team=x
	for i := range 30 {
		who := []string{"a", "b"}[i%2]
		labels := map[string]string{"n": fmt.Sprint(i)}
		if i%4 < 2 {
			labels["team"] = "x"
		}
		// Equal created_at in pairs: ties must be broken by id.
		sb := &Sandbox{ID: fmt.Sprintf("id-%02d", 29-i), WorkspaceID: "w", CreatedBy: who, Name: fmt.Sprintf("n-%02d", i),
			Status: "stopped", Token: "t", CreatedAt: base.Add(time.Duration(i/2) * time.Second), UpdatedAt: base, Labels: labels}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if i == 4 || i == 8 {
			putShare(t, st, ShareSandbox, sb.ID, "b", "read")
		}
		if (who == "b" || i == 4 || i == 8) && labels["team"] == "x" {
			want[sb.Name] = true
		}
	}
	return st, want
}

// TestListLabelsKeysetPaging: a label filter and the visibility filter
// apply in the query, and keyset pages (After) walk the filtered list
// once, in order, whatever is inserted between pages, in both directions
// and by several columns.
func TestListLabelsKeysetPaging(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		sortBy string
		desc   bool
	}{{"", false}, {"", true}, {"name", false}, {"name", true}, {"created_at", true}} {
		st, want := keysetFixture(t)
		o := ListOptions{VisibleTo: "b", Labels: []LabelSelector{{Key: "team", Value: "x", HasValue: true}, {Key: "n"}},
			SortBy: c.sortBy, Desc: c.desc, Limit: 3}
		var seen []string
		for page := 0; ; page++ {
			list, err := st.ListSandboxes(ctx, "w", o)
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range list {
				if !want[sb.Name] {
					t.Fatalf("%+v: %s (%s, %v) got through the filters", c, sb.Name, sb.CreatedBy, sb.Labels)
				}
				seen = append(seen, sb.Name)
			}
			if len(list) < o.Limit {
				break
			}
			// A concurrent insert of one of b's, sorting after every
			// other, must not shift the walk.
			late := &Sandbox{ID: fmt.Sprintf("zz-%d", page), WorkspaceID: "w", CreatedBy: "b", Name: fmt.Sprintf("zz-%d", page),
				Status: "stopped", Token: "t", CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC(), Labels: map[string]string{"team": "y", "n": "1"}}
			if err := st.CreateSandbox(ctx, late); err != nil {
				t.Fatal(err)
			}
			last := list[len(list)-1]
			cur, err := DecodeCursor(EncodeCursor("sandboxes", c.sortBy, c.desc, SandboxCursor(last, c.sortBy)), "sandboxes", c.sortBy, c.desc)
			if err != nil {
				t.Fatal(err)
			}
			o.After = cur
		}
		if len(seen) != len(want) {
			t.Fatalf("%+v: walked %v, want the %d of %v", c, seen, len(want), want)
		}
		if c.sortBy == "name" {
			sorted := slices.Clone(seen)
			slices.Sort(sorted)
			if c.desc {
				slices.Reverse(sorted)
			}
			if !slices.Equal(seen, sorted) {
				t.Fatalf("%+v: out of order: %v", c, seen)
			}
		}
	}
}

// TestCursorBoundToItsList: a cursor only pages the list and order it
// came from.
func TestCursorBoundToItsList(t *testing.T) {
	c := EncodeCursor("sandboxes", "name", false, Cursor{Value: "n", ID: "x"})
	for _, bad := range []struct{ kind, sort string }{{"snapshots", "name"}, {"sandboxes", "created_at"}} {
		if _, err := DecodeCursor(c, bad.kind, bad.sort, false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("cursor of sandboxes by name decoded for %+v: %v", bad, err)
		}
	}
	if _, err := DecodeCursor(c, "sandboxes", "name", true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("ascending cursor decoded for a descending list: %v", err)
	}
	if _, err := DecodeCursor("12", "sandboxes", "", false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an offset decoded as a keyset cursor: %v", err)
	}
	got, err := DecodeCursor(EncodeCursor("sandboxes", "idle_ttl_seconds", false, Cursor{Value: int64(600), ID: "x"}), "sandboxes", "idle_ttl_seconds", false)
	if err != nil || got.Value != int64(600) || got.ID != "x" {
		t.Fatalf("integer cursor: %+v %v", got, err)
	}
}

// TestSnapshotTags: a tag moves to the newest snapshot given it; name:tag
// addresses its holder; a bare name (or :latest) is the latest tag, else
// the newest of the name; labels round-trip.
func TestSnapshotTags(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC()
	mk := func(id, name, tag string, at int) {
		sn := &Snapshot{ID: id, WorkspaceID: "w", CreatedBy: "u", Name: name, Status: protocol.SnapshotReady, Tag: tag,
			Labels: map[string]string{"id": id}, CreatedAt: base.Add(time.Duration(at) * time.Second), UpdatedAt: base}
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	mk("s1", "py", "latest", 1)
	mk("s2", "py", "v1", 2)
	mk("s3", "py", "latest", 3) // takes latest from s1
	mk("s4", "py", "", 4)       // untagged, newest
	mk("o1", "other", "", 1)
	for _, c := range []struct{ name, tag, want string }{
		{"py", "", "s3"}, {"py", "latest", "s3"}, {"py", "v1", "s2"}, {"other", "", "o1"},
	} {
		sn, err := st.SnapshotByName(ctx, "w", c.name, c.tag)
		if err != nil || sn.ID != c.want || sn.Labels["id"] != c.want {
			t.Errorf("%s:%s = %+v %v, want %s", c.name, c.tag, sn, err, c.want)
		}
	}
	if _, err := st.SnapshotByName(ctx, "w", "py", "v2"); !errdefs.IsNotFound(err) {
		t.Errorf("py:v2: %v", err)
	}
	s1, err := st.GetSnapshot(ctx, "w", "s1")
	if err != nil || s1.Tag != "" {
		t.Fatalf("s1 kept its tag: %+v %v", s1, err)
	}
	list, err := st.ListSnapshots(ctx, "w", ListOptions{Name: "py", Labels: []LabelSelector{{Key: "id", Value: "s2", HasValue: true}}})
	if err != nil || len(list) != 1 || list[0].Tag != "v1" {
		t.Fatalf("snapshots py with label id=s2: %+v %v", list, err)
	}
}
