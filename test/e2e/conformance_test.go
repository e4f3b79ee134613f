package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestConformance runs test/conformance/conformance.mjs, the protocol
// conformance suite, with the unmodified official client (each of
// clientVersions) against a gvisor daemon: once with `ws` installed
// (WebSocket exec, streaming, PTY, reconnects) and once without (HTTP POST
// /execute; WS-only methods must throw the client's "requires the 'ws'
// package" error); then with the newest client over WebSocket against a
// microvm daemon. The passes run in parallel with each other (and the
// test with the package's other parallel tests, after the rest).
//
// The idle-TTL and delete-after-stop checks wait for the protocol's 60 s
// unit; they run only in the first version's websocket pass and not with
// -short. Set
// CONFORMANCE_ONLY=<regexp> to run a subset of the checks.
func TestConformance(t *testing.T) {
	t.Parallel()
	ref := testImage(t)
	// The reaper enforces idle_ttl_seconds / delete_after_stop_seconds; a
	// short interval keeps the TTL checks near their 60 s minimum.
	env := []string{"CUBICLE_REAP_INTERVAL=2s"}
	// The gvisor passes share one daemon (every name a pass creates has a
	// prefix of its own); another runtime's pass starts its own, which
	// ends with the pass.
	shared := startDaemonEnv(t, "gvisor", "", env)
	script := filepath.Join(repoRoot(t), "test", "conformance", "conformance.mjs")
	type pass struct {
		name, version string
		ws            bool
		path          string
		slow          bool
		runtime       string
	}
	// The whole suite once more on the microVM runtime, with the newest
	// client over WebSocket; first, as the longest pass.
	passes := []pass{{"microvm", clientVersions[len(clientVersions)-1], true, "exec-path=websocket", false, "microvm"}}
	for i, v := range clientVersions {
		// The TTL checks time the server, not the client: once is enough.
		passes = append(passes,
			pass{"websocket", v, true, "exec-path=websocket", !testing.Short() && i == 0, "gvisor"},
			pass{"http", v, false, "exec-path=http", false, "gvisor"})
	}
	data, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range passes {
		// Installed and written here, one pass at a time: passes of one
		// client version share its directory, and run in parallel.
		dir := npmDirVersion(t, tc.version, tc.ws)
		dst := filepath.Join(dir, "conformance.mjs")
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Run(tc.version+"/"+tc.name, func(t *testing.T) {
			t.Parallel() // the passes wait on the server far more than they compute
			d := shared
			if tc.runtime != "gvisor" {
				d = startDaemonEnv(t, tc.runtime, "", env)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", dst)
			cmd.Dir = dir
			slow := "0"
			if tc.slow {
				slow = "1"
			}
			if v, ok := os.LookupEnv("CONFORMANCE_SLOW"); ok {
				slow = v
			}
			cmd.Env = append(os.Environ(),
				"LANGSMITH_ENDPOINT="+d.Endpoint,
				"LANGSMITH_API_KEY="+testKey,
				"CONFORMANCE_IMAGE="+ref,
				"CONFORMANCE_SLOW="+slow,
			)
			out := &lineLogger{t: t}
			cmd.Stdout, cmd.Stderr = out, out
			runErr := cmd.Run()
			out.flush()
			text := out.String()
			if !strings.Contains(text, tc.path) {
				t.Errorf("suite did not run over %s", tc.path)
			}
			if runErr != nil || !strings.Contains(text, "CONFORMANCE PASSED") {
				var fails []string
				for _, l := range strings.Split(text, "\n") {
					if strings.HasPrefix(l, "FAIL ") {
						fails = append(fails, l)
					}
				}
				t.Fatalf("conformance over %s failed (%v): %d failing check(s):\n%s", tc.path, runErr, len(fails), strings.Join(fails, "\n"))
			}
		})
	}
}

// lineLogger sends a child's output to t.Log line by line as it arrives
// (so `go test -v` shows progress) and keeps all of it.
type lineLogger struct {
	t       *testing.T
	mu      sync.Mutex
	all     bytes.Buffer
	pending []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.pending = append(l.pending, p...)
	for {
		i := bytes.IndexByte(l.pending, '\n')
		if i < 0 {
			break
		}
		l.t.Log(string(l.pending[:i]))
		l.pending = l.pending[i+1:]
	}
	return len(p), nil
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) > 0 {
		l.t.Log(string(l.pending))
		l.pending = nil
	}
}

func (l *lineLogger) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}
