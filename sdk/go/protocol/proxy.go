package protocol

import (
	"encoding/json"
	"errors"
)

// ProxyConfig is the shape of a sandbox's proxy_config (spec §4.4): egress
// access control and the rules by which the egress proxy injects
// credentials. Requests carry it as raw JSON (CreateSandboxRequest and
// UpdateSandboxRequest keep it so, for the manager stores and the proxy
// parses it); this type is the schema the API checks it against, so a
// member outside it is refused instead of ignored.
type ProxyConfig struct {
	Rules         []ProxyRule    `json:"rules,omitempty"`
	AccessControl *AccessControl `json:"access_control,omitempty"`
	// Callbacks ask a customer endpoint for headers to inject.
	Callbacks []ProxyCallback `json:"callbacks,omitempty"`
	// NoProxy hosts are never intercepted: no rule or callback applies to
	// them (access_control still does).
	NoProxy []string `json:"no_proxy,omitempty"`
}

// ProxyCallback is one proxy callback: for requests to MatchHosts the
// proxy POSTs a signed description to URL and injects the headers it
// answers ({"headers": {...}}), cached for TTLSeconds.
type ProxyCallback struct {
	URL            string   `json:"url"`
	MatchHosts     []string `json:"match_hosts"`
	TTLSeconds     int64    `json:"ttl_seconds,omitempty"`
	FullRequest    bool     `json:"full_request,omitempty"`
	RequestHeaders []string `json:"request_headers,omitempty"`
}

// AccessControl restricts egress: only one of its lists may be given.
type AccessControl struct {
	AllowList []string `json:"allow_list,omitempty"`
	DenyList  []string `json:"deny_list,omitempty"`
}

// ProxyRule is one header-injection, aws or gcp rule.
type ProxyRule struct {
	Name       string        `json:"name,omitempty"`
	Type       string        `json:"type,omitempty"`
	Enabled    *bool         `json:"enabled,omitempty"`
	MatchHosts []string      `json:"match_hosts,omitempty"`
	MatchPaths []string      `json:"match_paths,omitempty"`
	Headers    []ProxyHeader `json:"headers,omitempty"`
	AWS        *ProxyAWS     `json:"aws,omitempty"`
	GCP        *ProxyGCP     `json:"gcp,omitempty"`
	// EnvVars are plaintext dummy variables set for every command while
	// the rule is enabled, so tools that want a credential variable start;
	// the real credential is injected on the wire.
	EnvVars map[string]string `json:"env_vars,omitempty"`
}

// ProxyEnvVars returns the env_vars of raw proxy_config's enabled rules,
// later rules winning; nil when there are none or raw does not parse (the
// API validated it on the way in).
func ProxyEnvVars(raw []byte) map[string]string {
	var pc ProxyConfig
	if len(raw) == 0 || json.Unmarshal(raw, &pc) != nil {
		return nil
	}
	var out map[string]string
	for _, r := range pc.Rules {
		if r.Enabled != nil && !*r.Enabled {
			continue
		}
		for k, v := range r.EnvVars {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// ProxyHeader is one header a rule sets.
type ProxyHeader struct {
	Name  string      `json:"name"`
	Type  string      `json:"type,omitempty"`
	Value SecretValue `json:"value"`
}

// ProxyAWS is an aws rule's credentials: a role (assumed through STS with
// the workspace secrets AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the
// session tagged with SessionTags) or a static key pair. Region and Service
// are Cubicle extensions for hosts outside AWS's naming scheme.
type ProxyAWS struct {
	RoleARN         string            `json:"role_arn,omitempty"`
	SessionTags     map[string]string `json:"session_tags,omitempty"`
	AccessKeyID     *SecretValue      `json:"access_key_id,omitempty"`
	SecretAccessKey *SecretValue      `json:"secret_access_key,omitempty"`
	Region          string            `json:"region,omitempty"`
	Service         string            `json:"service,omitempty"`
}

// ProxyGCP is a gcp rule's credentials: a service-account key the proxy
// mints OAuth access tokens from, for Scopes (default cloud-platform).
type ProxyGCP struct {
	ServiceAccountJSON *SecretValue `json:"service_account_json,omitempty"`
	Scopes             []string     `json:"scopes,omitempty"`
}

// SecretValue is a value given as a plain string or as {type, value}
// (type workspace_secret, opaque or plaintext).
type SecretValue struct {
	Type  string `json:"type,omitempty"`
	Value string `json:"value"`
}

// UnmarshalJSON accepts a string (Type left empty) or an object.
func (s *SecretValue) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		*s = SecretValue{Value: str}
		return nil
	}
	type plain SecretValue
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return errors.New("must be a string or {type, value}")
	}
	*s = SecretValue(p)
	return nil
}

// Access delegation modes (spec B1).
const (
	DelegationInherit  = "INHERIT"
	DelegationExplicit = "EXPLICIT"
)

// AccessDelegation lets code in a sandbox call the control plane as its
// creator (spec B1). INHERIT has no permissions; EXPLICIT lists them.
type AccessDelegation struct {
	Mode        string   `json:"mode"`
	Permissions []string `json:"permissions,omitempty"`
}
