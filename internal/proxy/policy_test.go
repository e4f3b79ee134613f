package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

func TestPolicyMatching(t *testing.T) {
	od := netip.MustParseAddrPort("198.18.0.9:443")
	cases := []struct {
		cfg, host string
		od        netip.AddrPort
		allowed   bool
		target    string
	}{
		{`{"access_control":{"allow_list":["api.example.com"]}}`, "api.example.com", od, true, "api.example.com"},
		{`{"access_control":{"allow_list":["api.example.com"]}}`, "evil.com", od, false, ""},
		{`{"access_control":{"allow_list":["*.example.com"]}}`, "a.b.example.com", od, true, "a.b.example.com"},
		{`{"access_control":{"allow_list":["*.example.com"]}}`, "example.com", od, false, ""},
		{`{"access_control":{"allow_list":["~^api[0-9]+\\.x\\.com$"]}}`, "api42.x.com", od, true, "api42.x.com"},
		{`{"access_control":{"allow_list":["~^api[0-9]+\\.x\\.com$"]}}`, "api.x.com", od, false, ""},
		// Allowed by address: the proxy dials that address, not the name.
		{`{"access_control":{"allow_list":["198.18.0.0/24"]}}`, "whatever.test", od, true, "198.18.0.9"},
		{`{"access_control":{"allow_list":["198.18.0.0/24"]}}`, "198.18.0.7", od, true, "198.18.0.7"},
		{`{"access_control":{"deny_list":["evil.com","10.0.0.0/8"]}}`, "evil.com", od, false, ""},
		{`{"access_control":{"deny_list":["evil.com","198.18.0.0/24"]}}`, "good.com", od, false, ""},
		{`{"access_control":{"deny_list":["evil.com"]}}`, "good.com", od, true, "good.com"},
		{`{}`, "", od, true, "198.18.0.9"},
		// No proxy_config: a pass-through dials where the sandbox asked.
		{``, "any.com", od, true, "198.18.0.9"},
	}
	for _, c := range cases {
		p, err := Parse([]byte(c.cfg))
		if err != nil {
			t.Fatalf("%s: %v", c.cfg, err)
		}
		target, v := decide(p, c.host, c.od)
		if v.Allowed != c.allowed || v.Allowed && target != c.target {
			t.Errorf("%s host=%q: allowed=%v target=%q (%s), want %v %q", c.cfg, c.host, v.Allowed, target, v.Reason, c.allowed, c.target)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, cfg := range []string{
		`{"access_control":{"allow_list":["a.com"],"deny_list":["b.com"]}}`,
		`{"access_control":{"allow_list":["~("]}}`,
		`{"access_control":{"allow_list":["not a host"]}}`,
		`{"rules":[{"name":"r","match_hosts":["a.com"],"headers":[{"name":"X","type":"workspace_secret","value":"NAME"}]}]}`,
		`{"rules":[{"name":"r","headers":[]}]}`,
		`{"rules":[{"name":"r","type":"aws","match_hosts":["a.com"]}]}`,
		`{"rules":[{"name":"r","match_hosts":["a.com"],"headers":[{"name":"X","value":"a\r\nb"}]}]}`,
	} {
		_, err := Parse([]byte(cfg))
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%s: err = %v, want a FieldError", cfg, err)
		}
	}
}

func TestRules(t *testing.T) {
	p, err := Parse([]byte(`{"rules":[
		{"name":"gh","match_hosts":["api.github.com"],"match_paths":["/repos/"],"headers":[{"name":"Authorization","type":"workspace_secret","value":"{GH_TOKEN}"}]},
		{"name":"off","enabled":false,"match_hosts":["*.x.com"],"headers":[{"name":"A","type":"plaintext","value":"b"}]},
		{"name":"op","match_hosts":["*.y.com"],"headers":[{"name":"K","value":{"type":"opaque","value":"v"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Proxied() || p.Mode != ModeOpen {
		t.Fatalf("proxied=%v mode=%v", p.Proxied(), p.Mode)
	}
	if r := p.RulesFor("api.github.com", "/repos/a/b"); len(r) != 1 || r[0].Headers[0].Value != "GH_TOKEN" || r[0].Headers[0].Type != "workspace_secret" {
		t.Fatalf("RulesFor = %+v", r)
	}
	if r := p.RulesFor("api.github.com", "/user"); len(r) != 0 {
		t.Fatalf("path mismatch matched: %+v", r)
	}
	if p.Intercepts("a.x.com") {
		t.Fatal("disabled rule intercepts")
	}
	if r := p.RulesFor("a.y.com", "/"); len(r) != 1 || r[0].Headers[0].Type != "opaque" || r[0].Headers[0].Value != "v" {
		t.Fatalf("opaque = %+v", r)
	}
}

// grantOnly lets principals use only the secret names it holds.
type grantOnly map[string]bool

func (g grantOnly) Secret(ctx context.Context, ws, name string) ([]byte, error) { return nil, nil }
func (g grantOnly) MayUse(ctx context.Context, p auth.Principal, name string) error {
	if p.IsAdmin() || g[name] {
		return nil
	}
	return fmt.Errorf("secret %s: %w", name, errdefs.ErrForbidden)
}

// TestValidateChecksEverySecretReference: a proxy_config is refused when a
// header rule or an AWS rule references a workspace secret the caller may
// not use (a rule toward a host the caller controls would read it), and
// accepted when every reference is granted; disabled rules are not
// enforced, so they are not checked.
func TestValidateChecksEverySecretReference(t *testing.T) {
	s := &Service{cfg: Config{Secrets: grantOnly{"SHARED": true}}}
	member := auth.Principal{WorkspaceID: "w", User: "bob", Role: "member"}
	header := func(name string) string {
		return `{"rules":[{"name":"r","match_hosts":["attacker.example"],"headers":[{"name":"X","type":"workspace_secret","value":"{` + name + `}"}]}]}`
	}
	aws := `{"rules":[{"name":"a","type":"aws","aws":{"access_key_id":"AK","secret_access_key":{"type":"workspace_secret","value":"{ADMIN_ONLY}"}}}]}`
	disabled := `{"rules":[{"name":"d","enabled":false,"match_hosts":["x.example"],"headers":[{"name":"X","type":"workspace_secret","value":"{ADMIN_ONLY}"}]}]}`
	ctx := context.Background()
	for _, c := range []struct {
		cfg string
		ok  bool
	}{{header("SHARED"), true}, {header("ADMIN_ONLY"), false}, {aws, false}, {disabled, true}, {`{"rules":[]}`, true}} {
		err := s.Validate(ctx, member, []byte(c.cfg))
		if (err == nil) != c.ok || err != nil && !errors.Is(err, errdefs.ErrForbidden) {
			t.Errorf("%s: %v, want ok=%v", c.cfg, err, c.ok)
		}
	}
	if err := s.Validate(ctx, auth.Principal{WorkspaceID: "w", Role: "admin"}, []byte(aws)); err != nil {
		t.Errorf("admin: %v", err)
	}
}

// TestCheckHostIgnoresZone: a zoned IPv6 literal is checked as its address,
// so "fe80::1%eth0" cannot slip past a deny_list of fe80::/10 (found by
// FuzzParsePolicy: netip prefixes never contain a zoned address).
func TestCheckHostIgnoresZone(t *testing.T) {
	p, err := Parse([]byte(`{"access_control":{"deny_list":["fe80::/10","fd00::1%eth1"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"fe80::1%eth0", "fe80::1%25eth0", "fd00::1", "fd00::1%lo"} {
		if v := p.CheckHost(h); v.Allowed {
			t.Errorf("CheckHost(%q) = %+v, want denied", h, v)
		}
	}
}

// TestIPPatternWithTrailingDot: "169.254.169.254." in a deny_list denies
// that address (found by FuzzParsePolicy: it was kept as a host name that
// no IP-literal request could match, so the deny did nothing).
func TestIPPatternWithTrailingDot(t *testing.T) {
	p, err := Parse([]byte(`{"access_control":{"deny_list":["169.254.169.254."]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"169.254.169.254", "::ffff:169.254.169.254"} {
		if v := p.CheckHost(h); v.Allowed {
			t.Errorf("CheckHost(%q) = %+v, want denied", h, v)
		}
	}
}
