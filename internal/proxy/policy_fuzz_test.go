package proxy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// FuzzParsePolicy feeds arbitrary proxy_configs and hosts to the egress
// policy. Parse must not panic and must refuse bad input with a FieldError
// naming a proxy_config field; an accepted policy must answer every query
// without panicking and only name valid secrets. And a host listed on its
// own is what the list says: a deny_list of it refuses it and an allow_list
// of it admits it, whatever its spelling (case, trailing dot, IP form).
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []struct{ raw, host string }{
		{``, "example.com"},
		{`null`, "10.0.0.1"},
		{`{"access_control":{"allow_list":["*.github.com","api.openai.com","10.0.0.0/8","~^x[0-9]+\\.test$"]}}`, "api.github.com"},
		{`{"access_control":{"deny_list":["169.254.169.254","fd00::/8","evil.test"]}}`, "EVIL.test."},
		{`{"access_control":{"allow_list":[],"deny_list":[]}}`, "::ffff:169.254.169.254"},
		{`{"rules":[{"name":"gh","match_hosts":["api.github.com"],"match_paths":["/repos/*"],"headers":[{"name":"Authorization","type":"workspace_secret","value":"{GH_TOKEN}"}]}]}`, "api.github.com"},
		{`{"rules":[{"type":"aws","match_hosts":["*.amazonaws.com"],"aws":{"access_key_id":"{AK}","secret_access_key":"{SK}"}}]}`, "s3.us-east-1.amazonaws.com"},
		{`{"rules":[{"type":"gcp"}]}`, "fe80::1%eth0"},
		{`{"access_control":{"allow_list":[1]}}`, "x"},
	} {
		f.Add([]byte(s.raw), s.host)
	}
	f.Fuzz(func(t *testing.T, raw []byte, host string) {
		p, err := Parse(raw)
		if err != nil {
			checkFieldError(t, err)
		} else {
			h := normHost(host)
			p.CheckHost(h)
			p.RulesFor(h, "/"+host)
			p.Intercepts(h)
			p.Proxied()
			for _, n := range p.SecretNames() {
				if !ValidSecretName(n) {
					t.Fatalf("policy %q references invalid secret name %q", raw, n)
				}
			}
		}

		pat := strings.TrimSpace(host)
		if strings.HasPrefix(pat, "~") || strings.HasPrefix(pat, "*.") || strings.Contains(pat, "/") {
			return // patterns, not one host
		}
		for _, list := range []string{"allow_list", "deny_list"} {
			body, _ := json.Marshal(map[string]any{"access_control": map[string]any{list: []string{host}}})
			p, err := Parse(body)
			if err != nil {
				checkFieldError(t, err)
				continue
			}
			want := list == "allow_list"
			spellings := []string{pat, strings.ToUpper(pat)}
			if !strings.HasSuffix(pat, ".") {
				spellings = append(spellings, pat+".")
			}
			for _, spelling := range spellings {
				if v := p.CheckHost(normHost(spelling)); v.Allowed != want {
					t.Fatalf("%s [%q]: CheckHost(%q) = %+v", list, host, spelling, v)
				}
			}
		}
	})
}

func checkFieldError(t *testing.T, err error) {
	t.Helper()
	var fe *errdefs.FieldError
	if !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, "proxy_config") {
		t.Fatalf("Parse error %v is not a FieldError naming proxy_config", err)
	}
}
