package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cubicleCLI runs bin/cubicle against d with stdin and stdout (either may
// be nil), failing the test unless it exits 0.
func cubicleCLI(t *testing.T, d *daemon, stdin io.Reader, stdout io.Writer, args ...string) {
	t.Helper()
	bin, _ := binaries(t)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "CUBICLE_ENDPOINT="+d.Endpoint, "CUBICLE_API_KEY="+testKey)
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cubicle %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestCLIExecBinarySafe: `cubicle exec` carries stdin and stdout byte for
// byte (every byte value, 50 MiB of random bytes), a tar piped out of the
// sandbox lists, and `cubicle cp` copies a directory tree both ways with
// its modes.
func TestCLIExecBinarySafe(t *testing.T) {
	d := startDaemon(t, "namespace", "")
	sn := readySnapshot(t, d.Client, "bin", testImage(t))
	name := newSandbox(t, d.Client, sn.ID, nil).Name

	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	big := make([]byte, 50<<20)
	rand.Read(big)
	for _, tc := range []struct {
		name string
		data []byte
	}{{"every byte value", all}, {"50 MiB random", big}} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			cubicleCLI(t, d, bytes.NewReader(tc.data), nil, "exec", "-i", name, "--", "sh", "-c", "cat > /tmp/f")
			up := time.Since(start)
			if got := strings.Fields(mustRun(t, d.Client, name, "sha256sum /tmp/f"))[0]; got != sha256Hex(tc.data) {
				t.Fatalf("in the sandbox: sha256 %s, want %s", got, sha256Hex(tc.data))
			}
			var out bytes.Buffer
			start = time.Now()
			cubicleCLI(t, d, nil, &out, "exec", name, "--", "cat", "/tmp/f")
			down := time.Since(start)
			if sha256Hex(out.Bytes()) != sha256Hex(tc.data) {
				t.Fatalf("read back %d bytes, sha256 differs from the %d sent", out.Len(), len(tc.data))
			}
			mb := float64(len(tc.data)) / (1 << 20)
			t.Logf("%s: stdin → sandbox %v (%.1f MiB/s), sandbox → stdout %v (%.1f MiB/s)", tc.name,
				up.Round(time.Millisecond), mb/up.Seconds(), down.Round(time.Millisecond), mb/down.Seconds())
		})
	}

	t.Run("tar through stdout", func(t *testing.T) {
		var archive bytes.Buffer
		cubicleCLI(t, d, nil, &archive, "exec", name, "--", "tar", "c", "-C", "/etc", ".")
		list := exec.Command("tar", "t")
		list.Stdin = &archive
		out, err := list.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "./passwd") {
			t.Fatalf("tar t: %v\n%s", err, out)
		}
	})

	t.Run("cp a directory both ways", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "tree")
		os.MkdirAll(filepath.Join(src, "sub"), 0o750)
		os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
		os.WriteFile(filepath.Join(src, "sub", "secret"), all, 0o600)
		os.Symlink("../run.sh", filepath.Join(src, "sub", "link"))
		os.Chmod(src, 0o711)
		mustRun(t, d.Client, name, "mkdir -p /work")
		cubicleCLI(t, d, nil, nil, "cp", src, name+":/work/")
		got := mustRun(t, d.Client, name, "cd /work/tree && stat -c '%a %n' . run.sh sub sub/secret && readlink sub/link && sha256sum sub/secret && ./run.sh")
		want := "711 .\n755 run.sh\n750 sub\n600 sub/secret\n../run.sh\n" + sha256Hex(all) + "  sub/secret\nhi\n"
		if got != want {
			t.Fatalf("uploaded tree:\n%s\nwant:\n%s", got, want)
		}

		dst := filepath.Join(t.TempDir(), "back")
		cubicleCLI(t, d, nil, nil, "cp", name+":/work/tree", dst)
		for rel, mode := range map[string]fs.FileMode{".": fs.ModeDir | 0o711, "run.sh": 0o755, "sub": fs.ModeDir | 0o750, "sub/secret": 0o600, "sub/link": fs.ModeSymlink | 0o777} {
			fi, err := os.Lstat(filepath.Join(dst, rel))
			if err != nil || fi.Mode() != mode {
				t.Errorf("downloaded %s: %v (%v), want %v", rel, fi.Mode(), err, mode)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "sub", "secret")); !bytes.Equal(b, all) {
			t.Errorf("downloaded secret: %x", b)
		}
	})
}
