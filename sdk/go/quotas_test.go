package cubicle

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestQuotaMethods(t *testing.T) {
	d := newFakeDaemon(t)
	var put map[string]any
	d.mux.HandleFunc("PUT /v2/sandboxes/workspaces/{id}/quotas", func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&put); err != nil {
			t.Error(err)
		}
		var q protocol.Quota
		b, _ := json.Marshal(put)
		_ = json.Unmarshal(b, &q)
		writeJSON(w, http.StatusOK, protocol.WorkspaceQuota{WorkspaceID: r.PathValue("id"), Quota: q})
	})
	d.mux.HandleFunc("GET /v2/sandboxes/workspaces/{id}/usage", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, protocol.Usage{WorkspaceID: r.PathValue("id"), Sandboxes: 3})
	})
	d.mux.HandleFunc("GET /v2/sandboxes/workspaces/{id}/quotas", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusTooManyRequests, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "RateLimited", Message: "request rate limit exceeded"}})
	})
	c, ctx := d.client(), context.Background()
	five := int64(5)
	got, err := c.SetQuota(ctx, "team a", protocol.Quota{MaxSandboxes: &five})
	if err != nil || got.WorkspaceID != "team a" || *got.MaxSandboxes != 5 {
		t.Fatalf("SetQuota: %+v %v", got, err)
	}
	// Every member is sent, nil as null: a PUT replaces the whole quota.
	if v, ok := put["max_vcpus"]; !ok || v != nil || put["max_sandboxes"] != 5.0 {
		t.Fatalf("PUT body %v", put)
	}
	if u, err := c.Usage(ctx, "w"); err != nil || u.Sandboxes != 3 {
		t.Fatalf("Usage: %+v %v", u, err)
	}
	_, err = c.GetQuota(ctx, "w")
	if !IsRateLimited(err) || IsQuotaExceeded(err) {
		t.Fatalf("GetQuota answered 429 RateLimited: %v", err)
	}
}
