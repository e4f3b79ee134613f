package agent

import (
	"net/http"
	"os"
	"strings"
	"testing"
)

// TestSetIdentityRejectsBadInput checks that POST /v1/identity refuses
// what is not a hostname or machine-id, and unknown fields, with 400 and
// changes nothing (the request that would succeed is the drivers' test:
// here it would rename the host running the test).
func TestSetIdentityRejectsBadInput(t *testing.T) {
	c, _, addr := startAgent(t)
	ctx := ctxT(t)
	before, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ host, mid string }{
		{"", ""},
		{"Upper", ""},
		{"has space", ""},
		{"-lead", ""},
		{strings.Repeat("a", 64), ""},
		{"ok", "nothex"},
		{"ok", strings.Repeat("A", 32)},
	} {
		if err := c.SetIdentity(ctx, tc.host, tc.mid); !isStatus(err, http.StatusBadRequest) {
			t.Errorf("SetIdentity(%q, %q) = %v, want 400", tc.host, tc.mid, err)
		}
	}
	resp, err := http.Post("http://"+addr+"/v1/identity", "application/json", strings.NewReader(`{"hostname":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("identity without the token: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/identity", strings.NewReader(`{"hostname":"x","domain":"y"}`))
	req.Header.Set(TokenHeader, "Bearer "+testToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("identity with an unknown field: %d, want 400", resp.StatusCode)
	}
	if after, _ := os.Hostname(); after != before {
		t.Fatalf("hostname changed from %q to %q by refused requests", before, after)
	}
}

// TestKeepOwnCapsRefusesUnknownNames checks that OwnCapsEnv names only
// capabilities the agent knows to keep for itself: a typo must stop the
// agent rather than leave a capability in its commands' reach.
func TestKeepOwnCapsRefusesUnknownNames(t *testing.T) {
	if err := keepOwnCaps("CAP_SYS_ADMN"); err == nil {
		t.Fatal("keepOwnCaps accepted an unknown capability name")
	}
	if err := keepOwnCaps(""); err != nil {
		t.Fatalf("keepOwnCaps with nothing to keep: %v", err)
	}
}
