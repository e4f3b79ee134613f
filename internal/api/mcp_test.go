package api

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestMCPRoute: /mcp exists only WithMCP, and reaches the MCP handler
// only with a valid key, as X-Api-Key or Authorization: Bearer, which
// the handler then receives as the bearer token; anything else is a 401.
func TestMCPRoute(t *testing.T) {
	var got []string
	mcp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusAccepted)
	})
	srv := New(newFakeSandboxes(), fakeAuth{}, &fakeImages{}, "http://api.test", slog.New(slog.DiscardHandler), WithMCP(mcp))
	for _, tc := range []struct {
		name   string
		header [2]string
		want   int
	}{
		{"x-api-key", [2]string{"X-Api-Key", adminKey}, http.StatusAccepted},
		{"bearer", [2]string{"Authorization", "Bearer " + memberKey}, http.StatusAccepted},
		{"no key", [2]string{}, http.StatusUnauthorized},
		{"bad key", [2]string{"X-Api-Key", "nope"}, http.StatusUnauthorized},
		{"bad bearer", [2]string{"Authorization", "Bearer nope"}, http.StatusUnauthorized},
		{"basic", [2]string{"Authorization", "Basic " + adminKey}, http.StatusUnauthorized},
	} {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		if tc.header[0] != "" {
			r.Header.Set(tc.header[0], tc.header[1])
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: %d, want %d (%s)", tc.name, w.Code, tc.want, w.Body)
		}
	}
	if len(got) != 2 || got[0] != "Bearer "+adminKey || got[1] != "Bearer "+memberKey {
		t.Errorf("the MCP handler saw %q", got)
	}
	w := httptest.NewRecorder()
	plain := New(newFakeSandboxes(), fakeAuth{}, &fakeImages{}, "http://api.test", slog.New(slog.DiscardHandler))
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	r.Header.Set("X-Api-Key", adminKey)
	plain.ServeHTTP(w, r)
	if w.Code != http.StatusNotFound {
		t.Errorf("/mcp without WithMCP: %d, want 404", w.Code)
	}
}
