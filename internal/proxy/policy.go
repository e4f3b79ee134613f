package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/awssts"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Mode says how a Policy's patterns are read.
type Mode int

// Modes of access_control (spec §4.4): none, allow_list or deny_list.
const (
	// ModeOpen: no access_control; every destination is allowed.
	ModeOpen Mode = iota
	// ModeAllow: only destinations matching a pattern are allowed.
	ModeAllow
	// ModeDeny: destinations matching a pattern are refused.
	ModeDeny
)

func (m Mode) String() string {
	switch m {
	case ModeAllow:
		return "allow_list"
	case ModeDeny:
		return "deny_list"
	}
	return "open"
}

// Policy is a parsed proxy_config: who may be reached and which requests
// get headers injected. A Policy is immutable once built, so the proxy
// swaps whole Policies on update and in-flight connections keep theirs.
type Policy struct {
	Mode Mode
	// names are the host patterns (exact, *.glob, ~regex); nets the IPs
	// and CIDRs. An IP pattern is never matched against a name's DNS
	// answers at the packet level: see Nets.
	names []hostPattern
	nets  []netip.Prefix
	Rules []Rule
	// Callbacks ask a customer endpoint for the headers to inject.
	Callbacks []Callback
	// noProxy hosts are never intercepted: no rule or callback applies
	// and their TLS is spliced (access_control still does).
	noProxy []hostPattern
}

// Rule is one header-injection rule, an AWS rule (AWS set: requests to
// its hosts are re-signed with SigV4) or a GCP rule (GCP set: they get an
// OAuth bearer token minted from a service-account key).
type Rule struct {
	Name    string
	hosts   []hostPattern
	paths   []string // path.Match globs or prefixes ending in "/"; empty = all
	Headers []Header
	AWS     *AWSCredentials
	GCP     *GCPCredentials
}

// Header is one header a Rule sets. Value is resolved at request time:
// for workspace_secret it names the secret ({NAME} → NAME).
type Header struct {
	Name  string
	Type  string // workspace_secret | opaque | plaintext
	Value string
}

// hostPattern matches a lower-case host name (no port, no trailing dot).
type hostPattern struct {
	exact  string         // "api.x.com"
	suffix string         // "*.x.com" → ".x.com"
	re     *regexp.Regexp // "~..." (anchored by the caller's pattern, if at all)
	raw    string
}

func (p hostPattern) match(host string) bool {
	switch {
	case p.re != nil:
		return p.re.MatchString(host)
	case p.suffix != "":
		return strings.HasSuffix(host, p.suffix) && len(host) > len(p.suffix)
	default:
		return host == p.exact
	}
}

// wire is the subset of spec §4.4 this package enforces.
type wire struct {
	Rules         []wireRule `json:"rules"`
	AccessControl *struct {
		AllowList []string `json:"allow_list"`
		DenyList  []string `json:"deny_list"`
	} `json:"access_control"`
	Callbacks []wireCallback `json:"callbacks"`
	NoProxy   []string       `json:"no_proxy"`
}

type wireRule struct {
	Name       string       `json:"name"`
	Type       string       `json:"type"`
	Enabled    *bool        `json:"enabled"`
	MatchHosts []string     `json:"match_hosts"`
	MatchPaths []string     `json:"match_paths"`
	Headers    []wireHeader `json:"headers"`
	AWS        *wireAWS     `json:"aws"`
	GCP        *wireGCP     `json:"gcp"`
	// EnvVars are checked here and applied by the sandbox manager
	// (protocol.ProxyEnvVars).
	EnvVars map[string]string `json:"env_vars"`
}

type wireHeader struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

// Parse reads a raw proxy_config. Empty or null gives an open Policy with
// no rules. Errors are errdefs.FieldErrors naming the offending field.
// Rules this server cannot enforce (gcp, aws with role_arn) are refused
// rather than silently ignored: a sandbox must not run believing credentials
// are injected when they are not.
func Parse(raw []byte) (*Policy, error) {
	raw = bytes.TrimSpace(raw)
	p := &Policy{}
	if len(raw) == 0 || string(raw) == "null" {
		return p, nil
	}
	var w wire
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, errdefs.Field("proxy_config", "invalid: %v", err)
	}
	if ac := w.AccessControl; ac != nil {
		list, field := ac.AllowList, "proxy_config.access_control.allow_list"
		p.Mode = ModeAllow
		switch {
		case ac.AllowList != nil && ac.DenyList != nil:
			return nil, errdefs.Field("proxy_config.access_control", "give allow_list or deny_list, not both")
		case ac.DenyList != nil:
			list, field, p.Mode = ac.DenyList, "proxy_config.access_control.deny_list", ModeDeny
		case ac.AllowList == nil:
			p.Mode = ModeOpen
		}
		for i, s := range list {
			if err := p.addPattern(s); err != nil {
				return nil, errdefs.Field(fmt.Sprintf("%s[%d]", field, i), "%v", err)
			}
		}
	}
	for i, wr := range w.Rules {
		field := fmt.Sprintf("proxy_config.rules[%d]", i)
		for k := range wr.EnvVars {
			if !ValidSecretName(k) { // the same rule as a POSIX variable name
				return nil, errdefs.Field(field+".env_vars", "invalid variable name %q", k)
			}
		}
		if wr.Enabled != nil && !*wr.Enabled {
			continue
		}
		r, err := parseRule(wr)
		if err != nil {
			return nil, errdefs.Field(field, "%v", err)
		}
		p.Rules = append(p.Rules, r)
	}
	for i, wc := range w.Callbacks {
		cb, err := parseCallback(wc)
		if err != nil {
			return nil, errdefs.Field(fmt.Sprintf("proxy_config.callbacks[%d]", i), "%v", err)
		}
		p.Callbacks = append(p.Callbacks, cb)
	}
	for i, h := range w.NoProxy {
		hp, err := parseHost(h)
		if err != nil {
			return nil, errdefs.Field(fmt.Sprintf("proxy_config.no_proxy[%d]", i), "%v", err)
		}
		p.noProxy = append(p.noProxy, hp)
	}
	return p, nil
}

// SecretNames lists the workspace secrets p's rules reference (header
// values and AWS keys), each once, in rule order.
func (p *Policy) SecretNames() []string {
	var out []string
	add := func(h Header) {
		if h.Type == "workspace_secret" && !slices.Contains(out, h.Value) {
			out = append(out, h.Value)
		}
	}
	for _, r := range p.Rules {
		for _, h := range r.Headers {
			add(h)
		}
		if a := r.AWS; a != nil && a.RoleARN == "" {
			add(a.AccessKeyID)
			add(a.SecretAccessKey)
		}
		if r.AWS != nil && r.AWS.RoleARN != "" {
			add(Header{Type: "workspace_secret", Value: awssts.BaseAccessKeySecret})
			add(Header{Type: "workspace_secret", Value: awssts.BaseSecretKeySecret})
		}
		if r.GCP != nil {
			add(r.GCP.ServiceAccountJSON)
		}
	}
	return out
}

func (p *Policy) addPattern(s string) error {
	s = strings.TrimSpace(s)
	if pfx, err := netip.ParsePrefix(s); err == nil {
		p.nets = append(p.nets, pfx.Masked())
		return nil
	}
	// An address written with a trailing dot is still that address: kept
	// as a name it would never match the IP literal CheckHost is given.
	if a, err := netip.ParseAddr(strings.TrimSuffix(s, ".")); err == nil {
		a = a.Unmap().WithZone("")
		p.nets = append(p.nets, netip.PrefixFrom(a, a.BitLen()))
		return nil
	}
	hp, err := parseHost(s)
	if err != nil {
		return err
	}
	p.names = append(p.names, hp)
	return nil
}

func parseHost(s string) (hostPattern, error) {
	s = strings.TrimSpace(s)
	switch {
	case strings.HasPrefix(s, "~"):
		re, err := regexp.Compile(s[1:])
		if err != nil {
			return hostPattern{}, fmt.Errorf("bad regex %q: %v", s, err)
		}
		return hostPattern{re: re, raw: s}, nil
	case strings.HasPrefix(s, "*."):
		rest := normHost(s[2:])
		if !validName(rest) {
			return hostPattern{}, fmt.Errorf("bad glob %q", s)
		}
		return hostPattern{suffix: "." + rest, raw: s}, nil
	default:
		h := normHost(s)
		if !validName(h) {
			return hostPattern{}, fmt.Errorf("%q is not a domain, glob (*.x.com), IP, CIDR or ~regex", s)
		}
		return hostPattern{exact: h, raw: s}, nil
	}
}

func parseRule(wr wireRule) (Rule, error) {
	r := Rule{Name: wr.Name}
	switch wr.Type {
	case "", "header", "headers", "header_injection":
	case "aws":
		creds, err := parseAWS(wr.AWS)
		if err != nil {
			return Rule{}, err
		}
		r.AWS = creds
		if len(wr.MatchHosts) == 0 {
			wr.MatchHosts = DefaultAWSHosts
		}
	case "gcp":
		creds, err := parseGCP(wr.GCP)
		if err != nil {
			return Rule{}, err
		}
		r.GCP = creds
		if len(wr.MatchHosts) == 0 {
			wr.MatchHosts = DefaultGCPHosts
		}
	default:
		return Rule{}, fmt.Errorf("rule type %q is not supported by this server", wr.Type)
	}
	if len(wr.MatchHosts) == 0 {
		return Rule{}, fmt.Errorf("match_hosts is required")
	}
	for _, h := range wr.MatchHosts {
		hp, err := parseHost(h)
		if err != nil {
			return Rule{}, fmt.Errorf("match_hosts: %v", err)
		}
		r.hosts = append(r.hosts, hp)
	}
	for _, mp := range wr.MatchPaths {
		if !strings.HasPrefix(mp, "/") {
			return Rule{}, fmt.Errorf("match_paths: %q must start with /", mp)
		}
		if _, err := path.Match(mp, "/"); err != nil {
			return Rule{}, fmt.Errorf("match_paths: %q: %v", mp, err)
		}
		r.paths = append(r.paths, mp)
	}
	for j, wh := range wr.Headers {
		h, err := parseHeader(wh)
		if err != nil {
			return Rule{}, fmt.Errorf("headers[%d]: %v", j, err)
		}
		r.Headers = append(r.Headers, h)
	}
	return r, nil
}

func parseHeader(wh wireHeader) (Header, error) {
	if wh.Name == "" || strings.ContainsAny(wh.Name, " :\r\n\t") {
		return Header{}, fmt.Errorf("bad header name %q", wh.Name)
	}
	h, err := parseSecret(wh.Value, wh.Type)
	if err != nil {
		return Header{}, err
	}
	h.Name = wh.Name
	if strings.ContainsAny(h.Value, "\r\n") {
		return Header{}, fmt.Errorf("header value contains a line break")
	}
	return h, nil
}

// parseSecret reads a value that is a string (of type typ, plaintext if
// empty) or a Secret object {type, value} (spec §4.4). A workspace_secret's
// Value is the secret's NAME.
func parseSecret(raw json.RawMessage, typ string) (Header, error) {
	h := Header{Type: typ}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var sec struct{ Type, Value string }
		if err := json.Unmarshal(raw, &sec); err != nil {
			return Header{}, fmt.Errorf("value must be a string or {type, value}")
		}
		s = sec.Value
		if sec.Type != "" {
			h.Type = sec.Type
		}
	}
	h.Value = s
	switch h.Type {
	case "", "plaintext", "opaque":
		if h.Type == "" {
			h.Type = "plaintext"
		}
	case "workspace_secret":
		if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") || !ValidSecretName(s[1:len(s)-1]) {
			return Header{}, fmt.Errorf("workspace_secret value must be {NAME}, got %q", s)
		}
		h.Value = s[1 : len(s)-1]
	default:
		return Header{}, fmt.Errorf("unknown value type %q", h.Type)
	}
	return h, nil
}

// ValidSecretName reports whether s may name a workspace secret:
// 1–128 of [A-Za-z0-9_], not starting with a digit.
func ValidSecretName(s string) bool {
	if len(s) == 0 || len(s) > 128 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Proxied reports whether the proxy polices the sandbox's web traffic: it
// has a list to enforce, headers to inject or callbacks to ask.
// Otherwise the proxy is a pass-through that only records.
func (p *Policy) Proxied() bool {
	return p.Mode != ModeOpen || len(p.Rules) > 0 || len(p.Callbacks) > 0
}

// Nets returns the IP and CIDR patterns, the only ones enforced on raw IP
// traffic: names are enforced by the proxy on Host/SNI, and a name's DNS
// answers never become packet-level holes.
func (p *Policy) Nets() []netip.Prefix { return append([]netip.Prefix(nil), p.nets...) }

// Verdict is a policy decision with its reason, for the egress log.
type Verdict struct {
	Allowed bool
	Reason  string
}

// CheckHost decides for a request naming host (lower-cased, no port). An
// IP-literal host is checked against the IP patterns.
func (p *Policy) CheckHost(host string) Verdict {
	if a, err := netip.ParseAddr(host); err == nil {
		return p.CheckAddr(a)
	}
	hit := ""
	for _, n := range p.names {
		if n.match(host) {
			hit = n.raw
			break
		}
	}
	return p.decide(hit, "host "+host)
}

// CheckAddr decides for a connection to address a (no name known, or the
// address a name was dialled at). The zone is dropped before matching: a
// prefix never contains a zoned address, so "fe80::1%eth0" would otherwise
// slip past a deny_list of fe80::/10.
func (p *Policy) CheckAddr(a netip.Addr) Verdict {
	a = a.Unmap().WithZone("")
	hit := ""
	for _, n := range p.nets {
		if n.Contains(a) {
			hit = n.String()
			break
		}
	}
	return p.decide(hit, "address "+a.String())
}

func (p *Policy) decide(hit, what string) Verdict {
	switch p.Mode {
	case ModeAllow:
		if hit == "" {
			return Verdict{false, what + " is not in allow_list"}
		}
		return Verdict{true, "allow_list " + hit}
	case ModeDeny:
		if hit != "" {
			return Verdict{false, what + " matches deny_list " + hit}
		}
		return Verdict{true, "not in deny_list"}
	}
	return Verdict{true, "no access_control"}
}

// denyAddr reports whether a dial to a must be refused even though the
// request's name was allowed: in deny mode, names that resolve into a denied
// CIDR are refused (this narrows, never widens, what is reachable).
func (p *Policy) denyAddr(a netip.Addr) (string, bool) {
	if p.Mode != ModeDeny {
		return "", false
	}
	v := p.CheckAddr(a)
	return v.Reason, !v.Allowed
}

// RulesFor returns the rules matching host and path, in config order
// (none for a no_proxy host).
func (p *Policy) RulesFor(host, urlPath string) []Rule {
	if p.bypassed(host) {
		return nil
	}
	var out []Rule
	for _, r := range p.Rules {
		if r.matchHost(host) && r.matchPath(urlPath) {
			out = append(out, r)
		}
	}
	return out
}

// Intercepts reports whether some rule or callback matches host, so its
// TLS must be terminated to inject headers. A no_proxy host never is.
func (p *Policy) Intercepts(host string) bool {
	if p.bypassed(host) {
		return false
	}
	for _, r := range p.Rules {
		if r.matchHost(host) {
			return true
		}
	}
	for _, c := range p.Callbacks {
		if matchAny(c.hosts, host) {
			return true
		}
	}
	return false
}

// bypassed reports whether host is in no_proxy.
func (p *Policy) bypassed(host string) bool { return matchAny(p.noProxy, host) }

// CallbacksFor returns the callbacks matching host, in config order.
func (p *Policy) CallbacksFor(host string) []Callback {
	if p.bypassed(host) {
		return nil
	}
	var out []Callback
	for _, c := range p.Callbacks {
		if matchAny(c.hosts, host) {
			out = append(out, c)
		}
	}
	return out
}

func matchAny(ps []hostPattern, host string) bool {
	for _, h := range ps {
		if h.match(host) {
			return true
		}
	}
	return false
}

func (r Rule) matchHost(host string) bool { return matchAny(r.hosts, host) }

func (r Rule) matchPath(p string) bool {
	if len(r.paths) == 0 {
		return true
	}
	for _, mp := range r.paths {
		if strings.HasSuffix(mp, "/") && strings.HasPrefix(p, mp) || p == mp {
			return true
		}
		if ok, _ := path.Match(mp, p); ok {
			return true
		}
		if strings.HasSuffix(mp, "*") && strings.HasPrefix(p, strings.TrimSuffix(mp, "*")) {
			return true
		}
	}
	return false
}

// normHost lower-cases h and drops a trailing dot.
func normHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

func validName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
