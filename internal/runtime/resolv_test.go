package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestNameservers(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ host, want string }{
		{"nameserver 10.0.0.2\nnameserver 127.0.0.53\nsearch x\nnameserver ::ffff:192.0.2.1\n", "[10.0.0.2 192.0.2.1]"},
		{"nameserver 127.0.0.53\nnameserver 0.0.0.0\n", "[1.1.1.1 8.8.8.8]"},
		{"# nothing\n", "[1.1.1.1 8.8.8.8]"},
	} {
		p := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(p, []byte(c.host), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := Nameservers(p)
		if err != nil || fmt.Sprint(got) != c.want {
			t.Errorf("Nameservers(%q) = %v, %v; want %s", c.host, got, err, c.want)
		}
	}
	if got, err := Nameservers(filepath.Join(dir, "missing")); err != nil || fmt.Sprint(got) != "[1.1.1.1 8.8.8.8]" {
		t.Errorf("missing file: %v, %v", got, err)
	}
}
