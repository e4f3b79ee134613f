package cli

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/identity"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// syncAudit stores each access record at once.
type syncAudit struct{ st store.Store }

func (a syncAudit) Record(ctx context.Context, rec store.AccessRecord) {
	_ = a.st.AppendAccess(ctx, []store.AccessRecord{rec})
}

// newIdentityDaemon serves the real identity API (store, authenticator,
// identity service; no sandbox manager: only tenancy routes are called)
// and points the client commands at it with the instance admin key.
func newIdentityDaemon(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	root, err := auth.Bootstrap(ctx, st, "")
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.New(st)
	srv := httptest.NewServer(api.New(nil, authn, nil, "http://x", slog.New(slog.DiscardHandler),
		api.WithIdentity(identity.New(st, authn, syncAudit{st})), api.WithAccessLog(syncAudit{st})))
	t.Cleanup(srv.Close)
	t.Setenv(envEndpoint, srv.URL)
	t.Setenv(envAPIKey, root)
}

// mustCmd runs a fresh command and returns its stdout.
func mustCmd(t *testing.T, cmd *cobra.Command, args ...string) (string, string) {
	t.Helper()
	out, errOut, err := runCmd(cmd, "", args...)
	if err != nil {
		t.Fatalf("%s %v: %v (stderr %q)", cmd.Name(), args, err, errOut)
	}
	return out, errOut
}

func TestTenancyCommands(t *testing.T) {
	newIdentityDaemon(t)
	wsID, _ := mustCmd(t, newWorkspaceCmd(), "create", "team")
	wsID = strings.TrimSpace(wsID)
	if out, _ := mustCmd(t, newWorkspaceCmd(), "ls"); !strings.Contains(out, wsID) || !strings.Contains(out, "default") {
		t.Errorf("workspace ls:\n%s", out)
	}
	userID, _ := mustCmd(t, newUserCmd(), "create", "Mo", "--email", "mo@example.com", "--workspace", "team")
	userID = strings.TrimSpace(userID)
	if out, _ := mustCmd(t, newUserCmd(), "ls", "--workspace", wsID); !strings.Contains(out, "mo@example.com") {
		t.Errorf("user ls:\n%s", out)
	}
	key, warn := mustCmd(t, newKeyCmd(), "create", "--workspace", wsID, "--user", userID, "--role", "admin", "--name", "ci", "--expires", "1h")
	key = strings.TrimSpace(key)
	if !strings.HasPrefix(key, "cbk_") || !strings.Contains(warn, "shown only once") || !strings.Contains(warn, key[:12]) {
		t.Fatalf("key create: stdout %q, stderr %q", key, warn)
	}
	if out, _ := mustCmd(t, newKeyCmd(), "ls", "--workspace", wsID); !strings.Contains(out, key[:12]) || strings.Contains(out, key) ||
		!strings.Contains(out, "expires ") {
		t.Errorf("key ls shows no prefix or the key itself:\n%s", out)
	}
	t.Setenv(envAPIKey, key)
	if out, _ := mustCmd(t, newWhoAmICmd()); !strings.Contains(out, "Mo ("+userID+")") || !strings.Contains(out, "team") ||
		!strings.Contains(out, "admin") || strings.Contains(out, "instance admin") {
		t.Errorf("whoami:\n%s", out)
	}
	if out, _ := mustCmd(t, newAccessLogCmd(), "--limit", "50"); !strings.Contains(out, "key.create") || !strings.Contains(out, "user.create") {
		t.Errorf("access-log:\n%s", out)
	}
	if _, _, err := runCmd(newWorkspaceCmd(), "", "create", "other"); err == nil || !strings.Contains(err.Error(), "instance admin") {
		t.Errorf("workspace create by a workspace admin: %v", err)
	}
	if out, _ := mustCmd(t, newUserCmd(), "rm", userID); strings.TrimSpace(out) != userID {
		t.Errorf("user rm printed %q", out)
	}
	if _, _, err := runCmd(newWhoAmICmd(), ""); err == nil {
		t.Error("the deleted user's key still works")
	}
}
