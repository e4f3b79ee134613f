package drivertest

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// testTokenHidden reads, as root inside the sandbox, everything of every
// process that could carry the agent's token (environment, argv, PID 1's
// stdin, which the token arrived on) and checks that the token is in none
// of it, nor in any file the sandbox wrote (which a snapshot would copy).
func testTokenHidden(t *testing.T, env *Env, d runtime.Driver) {
	s := env.Start(t, d, runtime.Limits{}, nil)
	s.MustExec(t, "sleep 300 >/dev/null 2>&1 &")
	out := s.MustExec(t, "id -u; for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; echo; done 2>/dev/null; cat /proc/1/fd/0; ls -l /proc/1/fd/0")
	if !strings.HasPrefix(out, "0\n") {
		t.Fatalf("not root inside: %q", out)
	}
	if !strings.Contains(out, "agent") {
		t.Fatalf("could not read PID 1's cmdline: %q", out)
	}
	if strings.Contains(out, s.token) {
		t.Fatalf("the agent token is readable inside:\n%s", out)
	}
	// The token lives in the agent's memory: root inside, lacking
	// CAP_SYS_PTRACE, must not be able to read it (/proc/1/mem needs the
	// same access as ptrace, as do maps and environ).
	if out, _, code := s.Exec(t, "cat /proc/1/maps"); code == 0 {
		t.Errorf("root inside can read PID 1's memory map (and so its memory):\n%.300s", out)
	}
	filepath.WalkDir(s.RootFS.Upper, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(s.token)) {
				t.Errorf("the agent token is in the sandbox's file %s", p)
			}
		}
		return nil
	})
}
