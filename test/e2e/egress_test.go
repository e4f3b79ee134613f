package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// egressEnv is a daemon whose egress proxy resolves the test names to the
// test internet and trusts its CA, plus a snapshot to boot.
type egressEnv struct {
	d    *daemon
	in   *internet
	snap string
}

// extraNames also resolve to the internet's first address.
func newEgressEnv(t testing.TB, rt string, extraNames ...string) *egressEnv {
	return newEgressEnvArgs(t, rt, nil, extraNames...)
}

// newEgressEnvArgs is newEgressEnv with extra daemon flags.
func newEgressEnvArgs(t testing.TB, rt string, flags []string, extraNames ...string) *egressEnv {
	in := newInternet(t)
	caFile := filepath.Join(t.TempDir(), "inet-ca.pem")
	if err := os.WriteFile(caFile, in.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--egress-ca-file", caFile}
	for name, i := range map[string]int{
		"allowed.test": 0, "secure.test": 0, "x.glob.test": 0, "api42.regex.test": 0, "api.regex.test": 0,
		"other.test": 1, "denied.test": 2,
	} {
		args = append(args, "--egress-resolve", name+"="+in.addr(i))
	}
	for _, name := range extraNames {
		args = append(args, "--egress-resolve", name+"="+in.addr(0))
	}
	d := startDaemonArgs(t, rt, "", append(args, flags...)...)
	sn := readySnapshot(t, d.Client, "egress", testImage(t))
	return &egressEnv{d: d, in: in, snap: sn.ID}
}

// sandbox creates a sandbox with proxy config pc and uploads the client
// and the test CA. The sandbox has no DNS for the test names (and /etc/hosts
// is read-only under gVisor): requests go to an address with the name in
// Host or SNI. The proxy resolves names itself, so which address the
// sandbox used does not matter for names.
func (e *egressEnv) sandbox(t testing.TB, name, pc string) *protocol.Sandbox {
	sb := newSandbox(t, e.d.Client, e.snap, func(r *protocol.CreateSandboxRequest) {
		r.Name = name
		if pc != "" {
			r.ProxyConfig = json.RawMessage(pc)
		}
	})
	e.upload(t, sb.Name)
	return sb
}

// upload copies the test client and the test CA into sandbox name.
func (e *egressEnv) upload(t testing.TB, name string) {
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	bin, err := os.Open(egClient(t))
	must(err)
	defer bin.Close()
	must(e.d.Client.WriteFile(ctx, name, "/usr/local/bin/egclient", bin))
	must(e.d.Client.WriteFile(ctx, name, "/tmp/inet-ca.pem", bytes.NewReader(e.in.caPEM)))
	mustRun(t, e.d.Client, name, "chmod +x /usr/local/bin/egclient")
}

// api sends a JSON request to the daemon's control plane as the admin.
func (e *egressEnv) api(t testing.TB, method, path string, body any) (int, []byte) {
	t.Helper()
	code, b := apiAs(t, e.d, testKey, method, path, body)
	return code, []byte(b)
}

// timed runs command and returns its output and how long it took.
func timed(t testing.TB, c *cubicle.Client, name, command string) (string, int, time.Duration) {
	start := time.Now()
	out, errs, code := run(t, c, name, command)
	return out + errs, code, time.Since(start)
}

// allowed requires command to succeed with want in its output.
func allowed(t *testing.T, c *cubicle.Client, name, command, want string) {
	t.Helper()
	out, code, _ := timed(t, c, name, command)
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("%q: exit %d, output %q; want success with %q", command, code, out, want)
	}
}

// deniedFast requires command to fail within 3 s (a reset, reject or
// 403, never a connect timeout) with one of wants in its output.
func deniedFast(t *testing.T, c *cubicle.Client, name, command string, wants ...string) {
	t.Helper()
	out, code, took := timed(t, c, name, command)
	if code == 0 {
		t.Fatalf("%q succeeded: %q", command, out)
	}
	if took > 3*time.Second {
		t.Fatalf("%q took %v to fail: want a fast refusal (%q)", command, took, out)
	}
	for _, w := range wants {
		if strings.Contains(out, w) {
			return
		}
	}
	t.Fatalf("%q: output %q, want one of %q", command, out, wants)
}

// get fetches url from inside the sandbox with egclient (busybox wget
// crashes under gVisor here); headers is an optional Host.
func get(url string, host ...string) string {
	cmd := "egclient "
	if len(host) > 0 {
		cmd += "-host " + host[0] + " "
	}
	return cmd + url + " 2>&1"
}

// wgetName fetches http://name/ by connecting to ip with Host: name.
func wgetName(name, ip string) string { return get("http://"+ip+"/", name) }

func TestEgress(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testEgress(t, rt) })
	}
}

func testEgress(t *testing.T, rt string) {
	e := newEgressEnv(t, rt)
	c := e.d.Client
	const secret = "sk-e2e-7f3c9a51d2b84e06"
	if code, b := e.api(t, "PUT", "/secrets/TEST_TOKEN", map[string]string{"value": "Bearer " + secret}); code != 200 {
		t.Fatalf("put secret: %d %s", code, b)
	}
	if code, b := e.api(t, "GET", "/secrets", nil); code != 200 || !strings.Contains(string(b), "TEST_TOKEN") || strings.Contains(string(b), secret) {
		t.Fatalf("list secrets: %d %s", code, b)
	}
	allowList := fmt.Sprintf(`{"access_control":{"allow_list":["allowed.test","secure.test","*.glob.test","~^api[0-9]+\\.regex\\.test$","%s/32"]},
		"rules":[{"name":"inject","match_hosts":["secure.test"],"headers":[
			{"name":"Authorization","type":"workspace_secret","value":"{TEST_TOKEN}"},
			{"name":"X-Opaque","type":"opaque","value":"opaque-e2e-value"}]}]}`, e.in.addr(0))
	sb := e.sandbox(t, "egress-a", allowList)
	other := newSandbox(t, c, e.snap, func(r *protocol.CreateSandboxRequest) { r.Name = "egress-b" })
	otherIP := strings.TrimSpace(mustRun(t, c, other.Name, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"))
	gw := strings.TrimSpace(mustRun(t, c, sb.Name, "ip route | awk '/default/ {print $3}'"))
	_, daemonPort, _ := net.SplitHostPort(e.d.listen)

	t.Run("allow list by name, glob, regex and CIDR", func(t *testing.T) {
		allowed(t, c, sb.Name, wgetName("allowed.test", e.in.addr(1)), "host=allowed.test")
		allowed(t, c, sb.Name, wgetName("x.glob.test", e.in.addr(1)), "host=x.glob.test")
		allowed(t, c, sb.Name, wgetName("api42.regex.test", e.in.addr(1)), "host=api42.regex.test")
		allowed(t, c, sb.Name, "nc -w 3 "+e.in.addr(0)+" 7000", "raw ok")
		deniedFast(t, c, sb.Name, wgetName("denied.test", e.in.addr(1)), "403")
		deniedFast(t, c, sb.Name, wgetName("api.regex.test", e.in.addr(1)), "403")
		deniedFast(t, c, sb.Name, wgetName("other.test", e.in.addr(1)), "403")
		// A forged Host cannot borrow an allowed address's name.
		deniedFast(t, c, sb.Name, get("http://"+e.in.addr(2)+"/", "denied.test"), "403")
		// Raw IP outside the list: rejected at once.
		deniedFast(t, c, sb.Name, "nc -w 5 "+e.in.addr(3)+" 7000 2>&1 | grep -v 'raw ok'; exit 1", "refused", "unreachable")
	})
	t.Run("TLS by SNI", func(t *testing.T) {
		allowed(t, c, sb.Name, "egclient -to "+e.in.addr(1)+" -ca /tmp/inet-ca.pem https://allowed.test/", "STATUS 200")
		deniedFast(t, c, sb.Name, "egclient -to "+e.in.addr(1)+" -ca /tmp/inet-ca.pem https://denied.test/", "reset", "EOF", "refused")
	})
	t.Run("header injection", func(t *testing.T) {
		// The sandbox trusts the egress CA through SSL_CERT_FILE; the
		// chain it sees is valid, and the server gets the secret.
		allowed(t, c, sb.Name, "egclient -to "+e.in.addr(1)+" https://secure.test/x", "auth-present=true")
		got := e.in.receivedAuth()
		if len(got) == 0 || got[len(got)-1] != "Bearer "+secret+"|opaque-e2e-value" {
			t.Fatalf("server received %q", got)
		}
		// The secret is nowhere inside: not in any process's environment,
		// not in any file.
		out, _, _ := run(t, c, sb.Name, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c "+secret+"; grep -rl "+secret+" / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; true")
		if strings.TrimSpace(out) != "0" {
			t.Fatalf("secret found inside the sandbox: %q", out)
		}
		env := mustRun(t, c, sb.Name, "env")
		if !strings.Contains(env, "SSL_CERT_FILE=") || !strings.Contains(env, "NODE_EXTRA_CA_CERTS=") {
			t.Fatalf("trust env missing: %q", env)
		}
	})
	t.Run("escapes", func(t *testing.T) {
		deniedFast(t, c, sb.Name, get("http://169.254.169.254/latest/meta-data/"), "403")
		deniedFast(t, c, sb.Name, get("http://"+otherIP+"/"), "403")
		// The daemon's own port is dropped (no answer at all) like every
		// other host port: it only has to fail.
		out, code, _ := timed(t, c, sb.Name, "timeout 5 egclient http://"+gw+":"+daemonPort+"/healthz 2>&1")
		if code == 0 || strings.Contains(out, "runtime") {
			t.Fatalf("daemon port reachable from the sandbox: %q", out)
		}
	})
	t.Run("PATCH to a deny list takes effect", func(t *testing.T) {
		deny := fmt.Sprintf(`{"access_control":{"deny_list":["denied.test","%s/32"]}}`, e.in.addr(3))
		code, b := e.api(t, "PATCH", "/boxes/"+sb.Name, map[string]json.RawMessage{"proxy_config": json.RawMessage(deny)})
		if code != 200 {
			t.Fatalf("patch: %d %s", code, b)
		}
		allowed(t, c, sb.Name, wgetName("other.test", e.in.addr(1)), "host=other.test")
		allowed(t, c, sb.Name, "nc -w 3 "+e.in.addr(1)+" 7000", "raw ok")
		deniedFast(t, c, sb.Name, wgetName("denied.test", e.in.addr(1)), "403")
		deniedFast(t, c, sb.Name, "nc -w 5 "+e.in.addr(3)+" 7000 2>&1 | grep -v 'raw ok'; exit 1", "refused", "unreachable")
		// Names that point at the host or metadata are refused by the proxy.
		deniedFast(t, c, sb.Name, get("http://"+e.in.addr(0)+"/", "localhost"), "403")
		deniedFast(t, c, sb.Name, get("http://"+e.in.addr(0)+"/", "169.254.169.254"), "403")
		deniedFast(t, c, sb.Name, get("http://"+gw+"/"), "403")
	})
	t.Run("egress log", func(t *testing.T) {
		code, b := e.api(t, "GET", "/boxes/"+sb.Name+"/egress-log", nil)
		var rep struct {
			Mode          string `json:"mode"`
			Denied        uint64 `json:"denied"`
			Allowed       uint64 `json:"allowed"`
			RawIPRejected uint64 `json:"raw_ip_rejected"`
			Events        []struct {
				Host    string `json:"host"`
				Allowed bool   `json:"allowed"`
			} `json:"events"`
		}
		if code != 200 || json.Unmarshal(b, &rep) != nil {
			t.Fatalf("egress-log: %d %s", code, b)
		}
		sawDenied := false
		for _, ev := range rep.Events {
			sawDenied = sawDenied || ev.Host == "denied.test" && !ev.Allowed
		}
		if rep.Mode != "deny_list" || rep.Denied == 0 || rep.Allowed == 0 || rep.RawIPRejected == 0 || !sawDenied || strings.Contains(string(b), secret) {
			t.Fatalf("egress-log: %s", b)
		}
	})
}
