package api

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// listQuery is a parsed list request: the store's options and how the
// caller pages.
type listQuery struct {
	store.ListOptions
	kind string
	// keyset: the caller pages the newer way (page_size without offset,
	// or a keyset cursor), so next_cursor is an opaque keyset cursor;
	// otherwise it stays the next offset, as older clients read it.
	keyset bool
}

// Query parameters of the lists: every list takes pageParams; sandbox
// and snapshot lists take filterParams too. Any other is a 422.
var (
	pageParams   = []string{"name_contains", "limit", "page_size", "offset", "cursor"}
	filterParams = []string{"label", "sort_by", "sort_order", "sort_direction", "created_by", "status"}
	listStatuses = map[string][]string{
		"sandboxes": {"provisioning", "ready", "failed", "stopped", "deleting"},
		"snapshots": {"building", "ready", "failed", "deleting"},
	}
)

// listOptions parses a list request of kind ("sandboxes", "snapshots",
// "registries"): name_contains; limit or its alias page_size (1..500,
// default 50); offset, or cursor (a next_cursor of this list, or an
// integer offset), where page_size or a keyset cursor asks for keyset
// next_cursors and anything else keeps offset ones; and for sandboxes and snapshots repeatable label=key
// and label=key=value (all must match), sort_by (store.SortColumns),
// sort_order or its alias sort_direction (asc, the default, or desc),
// created_by (me, or a user id) and status.
func listOptions(r *http.Request, kind string) (listQuery, error) {
	q := r.URL.Query()
	allowed := pageParams
	if _, ok := listStatuses[kind]; ok {
		allowed = slices.Concat(pageParams, filterParams)
	}
	for k := range q {
		if !slices.Contains(allowed, k) {
			return listQuery{}, errdefs.Field(k, "unknown query parameter; this list takes %s", strings.Join(allowed, ", "))
		}
	}
	o := listQuery{ListOptions: store.ListOptions{NameContains: q.Get("name_contains"), Limit: 50}, kind: kind,
		keyset: q.Has("page_size") && !q.Has("offset")}
	if err := o.parsePage(q.Get("limit"), q.Get("page_size"), q.Get("offset")); err != nil {
		return o, err
	}
	if err := o.parseFilters(r, q); err != nil {
		return o, err
	}
	return o, o.parseCursor(q.Get("cursor"), q.Has("offset"))
}

func (o *listQuery) parsePage(limit, pageSize, offset string) error {
	if limit != "" && pageSize != "" && limit != pageSize {
		return errdefs.Field("page_size", "limit and page_size disagree; give one")
	}
	field, v := "limit", limit
	if v == "" {
		field, v = "page_size", pageSize
	}
	if v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return errdefs.Field(field, "must be an integer between 1 and 500")
		}
		o.Limit = n
	}
	if offset != "" {
		n, err := strconv.Atoi(offset)
		if err != nil || n < 0 {
			return errdefs.Field("offset", "must be a non-negative integer")
		}
		o.Offset = n
	}
	return nil
}

func (o *listQuery) parseFilters(r *http.Request, q map[string][]string) error {
	for _, l := range q["label"] {
		k, v, hasValue := strings.Cut(l, "=")
		if err := sandbox.ValidateLabelKey("label", k); err != nil {
			return err
		}
		o.Labels = append(o.Labels, store.LabelSelector{Key: k, Value: v, HasValue: hasValue})
	}
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if v := get("sort_by"); v != "" {
		if !slices.Contains(store.SortColumns[o.kind], v) {
			return errdefs.Field("sort_by", "must be one of %s", strings.Join(store.SortColumns[o.kind], ", "))
		}
		o.SortBy = v
	}
	order, dir := get("sort_order"), get("sort_direction")
	if order != "" && dir != "" && order != dir {
		return errdefs.Field("sort_order", "sort_order and sort_direction disagree; give one")
	}
	switch order + dir {
	case "", "asc", "ascasc":
	case "desc", "descdesc":
		o.Desc = true
	default:
		return errdefs.Field("sort_order", "must be asc or desc")
	}
	if v := get("created_by"); v == "me" {
		p, _ := auth.FromContext(r.Context())
		o.CreatedBy = p.User
	} else {
		o.CreatedBy = v
	}
	if v := get("status"); v != "" {
		if !slices.Contains(listStatuses[o.kind], v) {
			return errdefs.Field("status", "must be one of %s", strings.Join(listStatuses[o.kind], ", "))
		}
		o.Status = v
	}
	return nil
}

// parseCursor reads cursor: an integer is an offset (what next_cursor
// was before keyset cursors), anything else an opaque keyset cursor.
func (o *listQuery) parseCursor(c string, hasOffset bool) error {
	if c == "" {
		return nil
	}
	if hasOffset {
		return errdefs.Field("cursor", "give cursor or offset, not both")
	}
	if n, err := strconv.Atoi(c); err == nil && n >= 0 {
		o.Offset, o.keyset = n, false
		return nil
	}
	if _, ok := listStatuses[o.kind]; !ok {
		return errdefs.Field("cursor", "must be a next_cursor this list returned")
	}
	after, err := store.DecodeCursor(c, o.kind, o.SortBy, o.Desc)
	if err != nil {
		return errdefs.Field("cursor", "not a next_cursor this list returned with this sort_by and sort_order")
	}
	o.After, o.keyset = after, true
	return nil
}

// page is the store query for o: one record more than the page, which
// tells whether another page follows.
func (o listQuery) page() store.ListOptions {
	p := o.ListOptions
	p.Limit++
	return p
}

// pageOf trims list (fetched with o.page()) to o's page and returns the
// page's next_cursor: nil on the last page, the opaque cursor of the
// page's last record for keyset callers, else (and on lists without
// keyset cursors, cursor nil) the next offset.
func pageOf[T any](o listQuery, list []T, cursor func(T) store.Cursor) ([]T, *string) {
	if len(list) <= o.Limit {
		return list, nil
	}
	list = list[:o.Limit]
	var next string
	if !o.keyset || cursor == nil {
		next = strconv.Itoa(o.Offset + len(list))
	} else {
		next = store.EncodeCursor(o.kind, o.SortBy, o.Desc, cursor(list[len(list)-1]))
	}
	return list, &next
}
