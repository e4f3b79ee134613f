package secrets

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

func TestVault(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	box, err := LoadOrCreate(filepath.Join(dir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "workspace-secrets.json")
	v, err := OpenVault(box, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Put(ctx, "ws1", "API_KEY", []byte("s3cr3t-value")); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if bytes.Contains(raw, []byte("s3cr3t-value")) {
		t.Fatal("plaintext in vault file")
	}
	v2, err := OpenVault(box, path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v2.Secret(ctx, "ws1", "API_KEY")
	if err != nil || string(got) != "s3cr3t-value" {
		t.Fatalf("Secret = %q, %v", got, err)
	}
	if _, err := v2.Secret(ctx, "ws2", "API_KEY"); !errdefs.IsNotFound(err) {
		t.Fatalf("other workspace: %v, want not found", err)
	}
	if l := v2.List(ctx, "ws1"); len(l) != 1 || l[0].Name != "API_KEY" {
		t.Fatalf("List = %+v", l)
	}
	if err := v2.Delete(ctx, "ws1", "API_KEY"); err != nil {
		t.Fatal(err)
	}
	if err := v2.Delete(ctx, "ws1", "API_KEY"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
}
