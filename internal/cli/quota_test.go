package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newQuotaDouble is a TEST DOUBLE of the daemon's quota routes: workspace
// w has max_sandboxes 5 and max_vcpus 8 until a PUT replaces them.
func newQuotaDouble(t *testing.T) (puts *[]map[string]any) {
	puts = &[]map[string]any{}
	five, eight := int64(5), int64(8)
	cur := protocol.Quota{MaxSandboxes: &five, MaxVCPUs: &eight}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv(envEndpoint, srv.URL)
	t.Setenv(envAPIKey, "k")
	mux.HandleFunc("GET /v2/sandboxes/workspaces/w/quotas", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(protocol.WorkspaceQuota{WorkspaceID: "w", Quota: cur})
	})
	mux.HandleFunc("PUT /v2/sandboxes/workspaces/w/quotas", func(w http.ResponseWriter, r *http.Request) {
		var raw map[string]any
		json.NewDecoder(r.Body).Decode(&raw)
		*puts = append(*puts, raw)
		b, _ := json.Marshal(raw)
		cur = protocol.Quota{}
		json.Unmarshal(b, &cur)
		json.NewEncoder(w).Encode(protocol.WorkspaceQuota{WorkspaceID: "w", Quota: cur})
	})
	mux.HandleFunc("GET /v2/sandboxes/workspaces/w/usage", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(protocol.Usage{WorkspaceID: "w", Sandboxes: 3, VCPUs: 6, MemBytes: 3 << 30, FSUsedBytes: 1 << 20})
	})
	return puts
}

func TestQuotaSetKeepsUnnamedQuotas(t *testing.T) {
	puts := newQuotaDouble(t)
	out, _, err := runCmd(newQuotaCmd(), "", "set", "w", "--max-mem", "2GiB", "--max-vcpus", "unlimited")
	if err != nil {
		t.Fatal(err)
	}
	if len(*puts) != 1 {
		t.Fatalf("%d PUTs", len(*puts))
	}
	p := (*puts)[0]
	if p["max_sandboxes"] != 5.0 || p["max_vcpus"] != nil || p["max_mem_bytes"] != float64(2<<30) || p["max_storage_bytes"] != nil {
		t.Fatalf("PUT body %v", p)
	}
	if !strings.Contains(out, "mem        2.0 GiB") || !strings.Contains(out, "vcpus      unlimited") {
		t.Fatalf("output:\n%s", out)
	}
	if _, _, err := runCmd(newQuotaCmd(), "", "set", "w", "--max-sandboxes", "-1"); err == nil || !strings.Contains(err.Error(), "--max-sandboxes") {
		t.Fatalf("negative count: %v", err)
	}
	if len(*puts) != 1 {
		t.Fatal("a refused flag still sent a PUT")
	}
}

func TestUsageCmd(t *testing.T) {
	newQuotaDouble(t)
	out, _, err := runCmd(newUsageCmd(), "", "w")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"QUOTA      USED     LIMIT", "sandboxes  3        5", "vcpus      6        8", "mem        3.0 GiB  unlimited", "(1.0 MiB measured on disk)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("usage output lacks %q:\n%s", want, out)
		}
	}
}
