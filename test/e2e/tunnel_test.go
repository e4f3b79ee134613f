package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestTunnel drives TCP tunnels (the newest clients' sb.tunnel) through the
// daemon into a real sandbox, per runtime: HTTP to busybox httpd, 20
// parallel echo streams (to 20 `nc -ll -e cat`) and a large byte-exact
// one, the refusals, `cubicle port-forward`, and a stop ending every
// tunnel at once.
func TestTunnel(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			f := startGatewayFixture(t, rt, "")
			c, name := f.d.Client, f.sb.Name
			// One echo server per port: busybox nc serves one connection
			// at a time.
			mustRun(t, c, name, "for p in $(seq 9000 9019); do setsid busybox nc -ll -p $p -e cat </dev/null >/dev/null 2>&1 & done")
			ctx := context.Background()
			tn, err := c.OpenTunnel(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			defer tn.Close()

			httpc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return tn.Dial(ctx, 8000)
			}}}
			var body string
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				resp, err := httpc.Get("http://sandbox/index.html")
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if body = string(b); resp.StatusCode == 200 {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("httpd through the tunnel: %v %q", err, body)
				}
			}
			if body != indexHTML {
				t.Fatalf("httpd through the tunnel served %q", body)
			}

			echo := func(port, size int) error {
				dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				// The nc servers were started in the background: one may
				// not listen yet on a loaded host.
				st, err := tn.Dial(dctx, port)
				for start := time.Now(); err != nil && strings.Contains(err.Error(), "nothing accepts") && time.Since(start) < 10*time.Second; {
					time.Sleep(100 * time.Millisecond)
					st, err = tn.Dial(dctx, port)
				}
				if err != nil {
					return err
				}
				defer st.Close()
				want := make([]byte, size)
				rand.Read(want)
				go st.Write(want)
				got := make([]byte, size)
				st.SetReadDeadline(time.Now().Add(60 * time.Second))
				if _, err := io.ReadFull(st, got); err != nil {
					return fmt.Errorf("read back: %w", err)
				}
				if !bytes.Equal(got, want) {
					return errors.New("bytes differ")
				}
				return nil
			}
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for i := range 20 {
				wg.Add(1)
				go func() { defer wg.Done(); errs <- echo(9000+i, 256<<10) }()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("parallel echo: %v", err)
				}
			}
			if err := echo(9000, 32<<20); err != nil {
				t.Fatalf("32 MiB echo: %v", err)
			}

			var te *cubicle.TunnelError
			if _, err := tn.Dial(ctx, 9999); !errors.As(err, &te) || te.Status != protocol.TunnelDialFailed {
				t.Errorf("port with no listener: %v, want dial-failed status", err)
			}
			if _, err := tn.Dial(ctx, 2375); err == nil {
				t.Error("the agent's port was reachable through a tunnel")
			}
			if _, err := tn.Dial(ctx, 8000); err != nil {
				t.Fatalf("the session did not survive refusals: %v", err)
			}

			pf, local := portForward(t, f.d, name, "0:8000")
			resp, err := http.Get("http://" + local + "/index.html")
			if err != nil {
				t.Fatalf("through cubicle port-forward: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != indexHTML {
				t.Fatalf("through cubicle port-forward: %q", b)
			}

			held, err := tn.Dial(ctx, 9000)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.StopSandbox(ctx, name); err != nil {
				t.Fatal(err)
			}
			select {
			case <-tn.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the tunnel stayed open after the sandbox stopped")
			}
			held.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := held.Read(make([]byte, 1)); err == nil {
				t.Fatal("a stream stayed open after the sandbox stopped")
			}
			done := make(chan error, 1)
			go func() { done <- pf.Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Error("port-forward exited 0 after the sandbox stopped")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("port-forward kept running after the sandbox stopped")
			}
		})
	}
}

// portForward starts `cubicle port-forward NAME spec` and returns it with
// the local address it listens on.
func portForward(t *testing.T, d *daemon, name, spec string) (*exec.Cmd, string) {
	bin, _ := binaries(t)
	cmd := exec.Command(bin, "port-forward", name, spec)
	cmd.Env = append(os.Environ(), "CUBICLE_ENDPOINT="+d.Endpoint, "CUBICLE_API_KEY="+testKey)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	// "Forwarding from 127.0.0.1:PORT -> REMOTE"
	f := strings.Fields(line)
	if err != nil || len(f) != 5 || f[0] != "Forwarding" {
		t.Fatalf("port-forward printed %q (%v), stderr %s", line, err, stderr.String())
	}
	return cmd, f[2]
}
