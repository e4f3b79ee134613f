package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// netEvent is the part of a network event's data the test reads.
type netEvent struct {
	Type      string   `json:"-"`
	Step      int64    `json:"-"`
	Method    string   `json:"method"`
	Scheme    string   `json:"scheme"`
	Host      string   `json:"host"`
	Path      string   `json:"path"`
	QueryKeys []string `json:"query_keys"`
	Status    int      `json:"status"`
	Dest      string   `json:"dest"`
	Port      int      `json:"port"`
	Protocol  string   `json:"protocol"`
	Name      string   `json:"name"`
	Answers   []string `json:"answers"`
	BytesUp   int64    `json:"bytes_up"`
	BytesDown int64    `json:"bytes_down"`
	Allowed   bool     `json:"allowed"`
	Reason    string   `json:"reason"`
	Rules     []string `json:"rules"`
}

// networkEvents waits until sandbox name's record has a network event
// match accepts (a flow is recorded when its connection closes), and
// returns the whole record with its network events.
func networkEvents(t *testing.T, c *cubicle.Client, name string, match func(netEvent) bool) (*protocol.AuditList, []netEvent) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(15 * time.Second)
	for {
		list, err := c.Audit(ctx, name, cubicle.AuditOptions{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var evs []netEvent
		found := false
		for _, e := range list.Items {
			if e.Kind != protocol.KindNetwork {
				continue
			}
			var n netEvent
			if err := json.Unmarshal(e.Data, &n); err != nil {
				t.Fatalf("event %d: %v", e.Seq, err)
			}
			n.Type, n.Step = e.Type, e.Step
			evs = append(evs, n)
			found = found || match(n)
		}
		if found {
			return list, evs
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(evs, "", " ")
			t.Fatalf("no matching network event in %s's record: %s", name, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stepOf is the step of the command whose string contains cmd.
func stepOf(t *testing.T, list *protocol.AuditList, cmd string) int64 {
	t.Helper()
	for _, e := range list.Items {
		if e.Type == protocol.EventCommandStarted && strings.Contains(string(e.Data), cmd) {
			return e.Step
		}
	}
	t.Fatalf("no command %q in the record", cmd)
	return 0
}

// TestAuditNetwork checks every outbound connection lands in the record:
// a sandbox without a proxy_config (the proxy a pass-through) makes an
// HTTP request, an HTTPS one, a raw TCP connection and a DNS lookup, each
// recorded in the step of its command with host, port and bytes; a
// sandbox whose proxy_config injects a secret header still gets it
// injected, and its record names the rule but holds the value nowhere; the
// JSONL export has the events.
func TestAuditNetwork(t *testing.T) {
	exportFile := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEgressEnvArgs(t, "namespace", []string{"--audit-export", "jsonl:" + exportFile})
	c := e.d.Client
	const secret = "sk-net-record-5e7a0c"
	if code, b := e.api(t, "PUT", "/secrets/TEST_TOKEN", map[string]string{"value": "Bearer " + secret}); code != 200 {
		t.Fatalf("put secret: %d %s", code, b)
	}
	open := e.sandbox(t, "net-open", "")
	web, raw := e.in.addr(1), e.in.addr(0)

	httpCmd := get("http://"+web+"/p/q?token=qv-secret-1", "plain.test")
	allowed(t, c, open.Name, httpCmd, "host=plain.test")
	httpsCmd := "egclient -to " + web + " -ca /tmp/inet-ca.pem https://allowed.test/tls-path"
	allowed(t, c, open.Name, httpsCmd, "STATUS 200")
	tcpCmd := "nc -w 3 " + raw + " 7000"
	allowed(t, c, open.Name, tcpCmd, "raw ok")
	dnsCmd := "nslookup allowed.test 2>&1"
	allowed(t, c, open.Name, dnsCmd, raw)

	list, evs := networkEvents(t, c, open.Name, func(n netEvent) bool { return n.Type == protocol.EventNetworkFlow && n.Port == 7000 })
	find := func(typ string, match func(netEvent) bool) netEvent {
		t.Helper()
		for _, n := range evs {
			if n.Type == typ && match(n) {
				return n
			}
		}
		b, _ := json.MarshalIndent(evs, "", " ")
		t.Fatalf("no %s event matching in %s", typ, b)
		return netEvent{}
	}
	h := find(protocol.EventNetworkHTTP, func(n netEvent) bool { return n.Host == "plain.test" })
	if h.Method != "GET" || h.Path != "/p/q" || !slices.Equal(h.QueryKeys, []string{"token"}) || h.Status != 200 ||
		h.Dest != web+":80" || h.BytesDown != int64(len("hello from the internet: host=plain.test\n")) || !h.Allowed ||
		h.Step != stepOf(t, list, "plain.test") {
		t.Fatalf("http event %+v", h)
	}
	s := find(protocol.EventNetworkTLS, func(n netEvent) bool { return n.Host == "allowed.test" })
	if s.Dest != web+":443" || s.BytesUp == 0 || s.BytesDown < 500 || !s.Allowed || s.Step != stepOf(t, list, "https://allowed.test") {
		t.Fatalf("tls event %+v", s)
	}
	f := find(protocol.EventNetworkFlow, func(n netEvent) bool { return n.Port == 7000 })
	// conntrack counts IP bytes: the 7-byte answer plus headers.
	if f.Protocol != "tcp" || f.Dest != raw || f.BytesUp == 0 || f.BytesDown <= 7 || f.Step != stepOf(t, list, tcpCmd) {
		t.Fatalf("flow event %+v", f)
	}
	d := find(protocol.EventNetworkDNS, func(n netEvent) bool { return n.Name == "allowed.test" && len(n.Answers) > 0 })
	if !slices.Contains(d.Answers, raw) || !d.Allowed || d.Step != stepOf(t, list, "nslookup") {
		t.Fatalf("dns event %+v", d)
	}

	pc := `{"rules":[{"name":"inject-token","match_hosts":["secure.test"],"headers":[
		{"name":"Authorization","type":"workspace_secret","value":"{TEST_TOKEN}"}]}]}`
	ruled := e.sandbox(t, "net-rule", pc)
	allowed(t, c, ruled.Name, "egclient -to "+web+" https://secure.test/x", "auth-present=true")
	if got := e.in.receivedAuth(); len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "Bearer "+secret) {
		t.Fatalf("server received %q", got)
	}
	rlist, revs := networkEvents(t, c, ruled.Name, func(n netEvent) bool { return n.Type == protocol.EventNetworkHTTP && n.Host == "secure.test" })
	for _, n := range revs {
		if n.Type == protocol.EventNetworkHTTP && n.Host == "secure.test" &&
			(n.Scheme != "https" || n.Status != 200 || !slices.Equal(n.Rules, []string{"inject-token"})) {
			t.Fatalf("injected request's event %+v", n)
		}
	}
	for name, l := range map[string]*protocol.AuditList{open.Name: list, ruled.Name: rlist} {
		all, _ := json.Marshal(l)
		if strings.Contains(string(all), secret) {
			t.Fatalf("%s's record holds the injected secret", name)
		}
	}
	// The query's value is in the command line the sandbox ran, never in
	// what the network record adds.
	for _, ev := range list.Items {
		if ev.Kind == protocol.KindNetwork && strings.Contains(string(ev.Data), "qv-secret-1") {
			t.Fatalf("network event holds a query value: %s", ev.Data)
		}
	}

	b, err := os.ReadFile(exportFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{protocol.EventNetworkHTTP, protocol.EventNetworkTLS, protocol.EventNetworkFlow, protocol.EventNetworkDNS} {
		if !strings.Contains(string(b), fmt.Sprintf(`"sandbox_id":%q`, open.ID)) || !strings.Contains(string(b), `"type":"`+want+`"`) {
			t.Fatalf("the export lacks %s events of %s", want, open.Name)
		}
	}
	if strings.Contains(string(b), secret) {
		t.Fatal("the export holds the secret")
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev protocol.AuditEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Seq == 0 || ev.SandboxID == "" {
			t.Fatalf("export line %q: %v", line, err)
		}
	}
}
