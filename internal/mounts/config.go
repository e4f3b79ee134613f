// Package mounts serves sandboxes' data mounts (mount_config, spec §4.5):
// S3 and GCS buckets as FUSE file systems and git repositories as
// read-only checkouts, all on the daemon's side of the sandbox boundary.
// A sandbox sees only a directory bound in by its runtime; credentials,
// caches and clones stay in the daemon.
package mounts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/cubicle-dev/cubicle/internal/awssts"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Mount types (spec §4.5).
const (
	TypeS3         = "s3"
	TypeGCS        = "gcs"
	TypeGit        = "git"
	TypeContextHub = "contexthub"
)

// Limits on a mount_config.
const (
	MaxMounts           = 16
	maxConfigBytes      = 256 << 10
	maxIDLen            = 128
	defaultCacheBytes   = 1 << 30
	maxWritebackSeconds = 3600
	defaultS3Endpoint   = "https://s3.amazonaws.com"
	defaultS3Region     = "us-east-1"
)

// Config is a parsed, valid mount_config. It is built only by Parse, so
// every field holds what the rules below allow.
type Config struct {
	Auth   Auth
	Mounts []Mount
}

// Auth is mount_config.auth: the credentials the daemon uses to reach the
// buckets. Nil members are absent.
type Auth struct {
	AWS *AWSAuth
	GCP *GCPAuth
}

// AWSAuth are S3 keys, or (RoleARN set, no keys) a role the daemon
// assumes through STS with the workspace's base credentials (the
// workspace secrets awssts.BaseAccessKeySecret and BaseSecretKeySecret),
// tagging the session with SessionTags. From is where they were given:
// "mount_config.auth.aws" or the proxy_config rule an S3 mount borrows
// them from.
type AWSAuth struct {
	AccessKeyID, SecretAccessKey Secret
	RoleARN                      string
	SessionTags                  map[string]string
	From                         string
}

// GCPAuth is a service-account key file.
type GCPAuth struct {
	ServiceAccountJSON Secret
}

// Secret is a credential value: opaque (Value is the value itself) or a
// workspace secret (Value is its NAME, resolved at mount time).
type Secret struct {
	Type  string // "opaque" | "workspace_secret"
	Value string
}

// Mount is one entry of mount_config.mounts.
type Mount struct {
	ID       string
	Type     string
	Path     string // absolute, clean path inside the sandbox
	ReadOnly bool
	Cache    Cache
	S3       *S3
	GCS      *GCS
	Git      *Git
}

// Cache configures a bucket mount's local cache.
type Cache struct {
	MaxSizeBytes int64
	// WritebackSeconds is how long a written file stays local before it
	// is uploaded; 0 uploads when the file is closed.
	WritebackSeconds int64
}

// S3 is an S3 (or S3-compatible) bucket.
type S3 struct {
	EndpointURL, Region, Bucket string
	Prefix                      string // "" or ends with "/"
	PathStyle                   bool
	KMSKey                      string // SSE-KMS key for uploads, if set
}

// GCS is a Google Cloud Storage bucket.
type GCS struct {
	Bucket, Prefix string
}

// Git is a repository checked out read-only.
type Git struct {
	RemoteURL      string
	RefType        string // "branch" | "tag" | "" (the remote's HEAD)
	RefName        string
	RefreshSeconds int64 // 0: never refreshed
}

// forbiddenCredentialKeys may not appear anywhere in a mount spec: the
// client's rule (credentials only in mount_config.auth), held here too.
var forbiddenCredentialKeys = []string{"access_key_id", "secret_access_key", "session_token", "service_account_json",
	"access_token", "refresh_token", "credentials", "credential"}

// bucketRE is an S3 bucket name (virtual-host-safe subset plus dots).
var bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// regionRE is a region name (AWS's, or an S3-compatible server's).
var regionRE = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)

// gcsBucketRE is a GCS bucket name (3–222 with dots; each part ≤ 63).
var gcsBucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$`)

// Parse checks raw mount_config against the client's rules and this
// server's, returning errdefs.FieldErrors naming the offending member.
// proxyConfig is the sandbox's proxy_config: an S3 mount may take its keys
// from an enabled aws rule there, and a provider may not be in both.
func Parse(raw, proxyConfig []byte) (*Config, error) {
	if len(raw) > maxConfigBytes {
		return nil, errdefs.Field("mount_config", "must be at most %d bytes", maxConfigBytes)
	}
	var top map[string]json.RawMessage
	if err := strictObject(raw, &top); err != nil {
		return nil, errdefs.Field("mount_config", "must be an object: %v", err)
	}
	o := object{path: "mount_config", m: top}
	if err := o.only("auth", "mounts"); err != nil {
		return nil, err
	}
	cfg := &Config{}
	rawMounts, ok := top["mounts"]
	var list []json.RawMessage
	if !ok || json.Unmarshal(rawMounts, &list) != nil || len(list) == 0 {
		return nil, errdefs.Field("mount_config.mounts", "must be a non-empty list of mounts")
	}
	if len(list) > MaxMounts {
		return nil, errdefs.Field("mount_config.mounts", "at most %d mounts", MaxMounts)
	}
	for i, r := range list {
		m, err := parseMount(fmt.Sprintf("mount_config.mounts[%d]", i), r)
		if err != nil {
			return nil, err
		}
		if err := checkDistinct(cfg.Mounts, m, i); err != nil {
			return nil, err
		}
		cfg.Mounts = append(cfg.Mounts, m)
	}
	if r, ok := top["auth"]; ok && string(bytes.TrimSpace(r)) != "null" {
		a, err := parseAuth(r)
		if err != nil {
			return nil, err
		}
		cfg.Auth = a
	}
	return cfg, checkProviders(cfg, proxyConfig)
}

// checkDistinct refuses a mount whose id or path another has, or whose
// path is under or over another's (binds would shadow each other).
func checkDistinct(prev []Mount, m Mount, i int) error {
	for _, p := range prev {
		if p.ID == m.ID {
			return errdefs.Field(fmt.Sprintf("mount_config.mounts[%d].id", i), "%q is given twice", m.ID)
		}
		if runtime.TargetsOverlap(m.Path, p.Path) {
			return errdefs.Field(fmt.Sprintf("mount_config.mounts[%d].mount_path", i), "%s overlaps mount %q at %s", m.Path, p.ID, p.Path)
		}
	}
	return nil
}

func parseMount(at string, raw json.RawMessage) (Mount, error) {
	var mm map[string]json.RawMessage
	if err := strictObject(raw, &mm); err != nil || len(mm) == 0 {
		return Mount{}, errdefs.Field(at, "must be a mount object")
	}
	if err := rejectCredentials(at, raw); err != nil {
		return Mount{}, err
	}
	o := object{path: at, m: mm}
	var m Mount
	var err error
	if m.Type, err = o.str("type", true); err != nil {
		return Mount{}, err
	}
	switch m.Type {
	case TypeS3, TypeGCS, TypeGit:
	case TypeContextHub:
		return Mount{}, errdefs.Field(at+".type", "contexthub mounts are not supported by this server (a hosted LangSmith feature); use a git mount")
	default:
		return Mount{}, errdefs.Field(at+".type", "must be one of s3, gcs, git (got %q)", m.Type)
	}
	allowed := []string{"id", "type", "mount_path", m.Type}
	if m.Type != TypeGit {
		allowed = append(allowed, "read_only", "cache")
	} else {
		allowed = append(allowed, "read_only")
	}
	if err := o.only(allowed...); err != nil {
		return Mount{}, err
	}
	if m.ID, err = o.str("id", true); err != nil {
		return Mount{}, err
	}
	if len(m.ID) > maxIDLen {
		return Mount{}, errdefs.Field(at+".id", "must be at most %d bytes", maxIDLen)
	}
	if m.Path, err = o.str("mount_path", true); err != nil {
		return Mount{}, err
	}
	if err := checkMountPath(at+".mount_path", m.Path); err != nil {
		return Mount{}, err
	}
	ro, set, err := o.boolean("read_only")
	if err != nil {
		return Mount{}, err
	}
	m.ReadOnly = ro
	sub, err := o.object(m.Type, true)
	if err != nil {
		return Mount{}, err
	}
	switch m.Type {
	case TypeS3:
		m.S3, err = parseS3(sub)
	case TypeGCS:
		m.GCS, err = parseGCS(sub)
	case TypeGit:
		if set && !ro {
			return Mount{}, errdefs.Field(at+".read_only", "git mounts are read-only")
		}
		m.ReadOnly = true
		m.Git, err = parseGit(sub)
	}
	if err != nil {
		return Mount{}, err
	}
	if m.Type != TypeGit {
		m.Cache, err = parseCache(o)
	}
	return m, err
}

// checkMountPath is the runtime's check of a mount target
// (runtime.ValidateTarget), and no control characters.
func checkMountPath(at, p string) error {
	if err := runtime.ValidateTarget(p); err != nil {
		return errdefs.Field(at, "%v (got %q)", err, p)
	}
	if strings.ContainsFunc(p, func(r rune) bool { return r == 0 || unicode.IsControl(r) }) {
		return errdefs.Field(at, "must not contain control characters")
	}
	return nil
}

func parseCache(o object) (Cache, error) {
	c := Cache{MaxSizeBytes: defaultCacheBytes}
	sub, err := o.object("cache", false)
	if err != nil || sub.m == nil {
		return c, err
	}
	if err := sub.only("max_size_bytes", "writeback_seconds"); err != nil {
		return c, err
	}
	if n, ok, err := sub.integer("max_size_bytes"); err != nil {
		return c, err
	} else if ok {
		if n < 1<<20 {
			return c, errdefs.Field(sub.path+".max_size_bytes", "must be at least 1048576 (1 MiB)")
		}
		c.MaxSizeBytes = n
	}
	if n, ok, err := sub.integer("writeback_seconds"); err != nil {
		return c, err
	} else if ok {
		if n < 0 || n > maxWritebackSeconds {
			return c, errdefs.Field(sub.path+".writeback_seconds", "must be between 0 and %d", maxWritebackSeconds)
		}
		c.WritebackSeconds = n
	}
	return c, nil
}

func parseS3(o object) (*S3, error) {
	if err := o.only("endpoint_url", "region", "bucket", "prefix", "path_style", "encryption"); err != nil {
		return nil, err
	}
	s := &S3{EndpointURL: defaultS3Endpoint, Region: defaultS3Region}
	var err error
	if v, err := o.str("endpoint_url", false); err != nil {
		return nil, err
	} else if v != "" {
		s.EndpointURL = strings.TrimRight(v, "/")
	}
	if err := checkEndpoint(o.path+".endpoint_url", s.EndpointURL); err != nil {
		return nil, err
	}
	if v, err := o.str("region", false); err != nil {
		return nil, err
	} else if v != "" {
		s.Region = v
	}
	if !regionRE.MatchString(s.Region) {
		return nil, errdefs.Field(o.path+".region", "%q is not a region name", s.Region)
	}
	if s.Bucket, err = o.str("bucket", true); err != nil {
		return nil, err
	}
	if !bucketRE.MatchString(s.Bucket) || strings.Contains(s.Bucket, "..") {
		return nil, errdefs.Field(o.path+".bucket", "%q is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')", s.Bucket)
	}
	if s.Prefix, err = parsePrefix(o); err != nil {
		return nil, err
	}
	if s.PathStyle, _, err = o.boolean("path_style"); err != nil {
		return nil, err
	}
	enc, err := o.object("encryption", false)
	if err != nil {
		return nil, err
	}
	if enc.m != nil {
		if err := enc.only("kms_key"); err != nil {
			return nil, err
		}
		if s.KMSKey, err = enc.str("kms_key", true); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func parseGCS(o object) (*GCS, error) {
	if err := o.only("bucket", "prefix"); err != nil {
		return nil, err
	}
	g := &GCS{}
	var err error
	if g.Bucket, err = o.str("bucket", true); err != nil {
		return nil, err
	}
	if !gcsBucketRE.MatchString(g.Bucket) {
		return nil, errdefs.Field(o.path+".bucket", "%q is not a GCS bucket name", g.Bucket)
	}
	g.Prefix, err = parsePrefix(o)
	return g, err
}

// parsePrefix reads an optional key prefix, normalised to end with "/".
func parsePrefix(o object) (string, error) {
	p, err := o.str("prefix", false)
	if err != nil || p == "" {
		return "", err
	}
	if strings.HasPrefix(p, "/") || strings.Contains(p, "//") || slices.Contains(strings.Split(strings.TrimSuffix(p, "/"), "/"), "..") ||
		strings.ContainsFunc(p, unicode.IsControl) {
		return "", errdefs.Field(o.path+".prefix", "must be a relative key prefix without empty, '..' or control parts (got %q)", p)
	}
	return strings.TrimSuffix(p, "/") + "/", nil
}

// checkEndpoint allows an absolute http(s) URL with a host and nothing
// that could smuggle credentials or requests (user info, query, fragment).
func checkEndpoint(at, s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return errdefs.Field(at, "must be an absolute http(s) URL (got %q)", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return errdefs.Field(at, "must be scheme://host[:port] without credentials, path, query or fragment")
	}
	return nil
}

// refNameRE is a safe subset of git ref names (git check-ref-format).
var refNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/+-]{0,254}$`)

func parseGit(o object) (*Git, error) {
	if err := o.only("remote_url", "ref", "refresh_interval_seconds"); err != nil {
		return nil, err
	}
	g := &Git{}
	var err error
	if g.RemoteURL, err = o.str("remote_url", true); err != nil {
		return nil, err
	}
	if err := checkRemoteURL(o.path+".remote_url", g.RemoteURL); err != nil {
		return nil, err
	}
	ref, err := o.object("ref", false)
	if err != nil {
		return nil, err
	}
	if ref.m != nil {
		if err := ref.only("type", "name"); err != nil {
			return nil, err
		}
		if g.RefType, err = ref.str("type", true); err != nil {
			return nil, err
		}
		if g.RefType != "branch" && g.RefType != "tag" {
			return nil, errdefs.Field(ref.path+".type", "must be branch or tag")
		}
		if g.RefName, err = ref.str("name", true); err != nil {
			return nil, err
		}
		if !refNameRE.MatchString(g.RefName) || strings.Contains(g.RefName, "..") || strings.HasSuffix(g.RefName, ".lock") ||
			strings.HasSuffix(g.RefName, "/") || strings.Contains(g.RefName, "//") {
			return nil, errdefs.Field(ref.path+".name", "%q is not a valid git ref name", g.RefName)
		}
	}
	if n, ok, err := o.integer("refresh_interval_seconds"); err != nil {
		return nil, err
	} else if ok {
		if n < 1 || n > 86400 {
			return nil, errdefs.Field(o.path+".refresh_interval_seconds", "must be between 1 and 86400")
		}
		g.RefreshSeconds = n
	}
	return g, nil
}

// checkRemoteURL holds the client's rules for a git remote.
func checkRemoteURL(at, s string) error {
	if s != strings.TrimSpace(s) || strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r == 0 }) {
		return errdefs.Field(at, "must not contain whitespace or NUL bytes")
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "":
		return errdefs.Field(at, "must be an absolute HTTPS URL")
	case u.User != nil:
		return errdefs.Field(at, "must not include embedded credentials")
	case u.Path == "" || u.Path == "/":
		return errdefs.Field(at, "must include a repository path")
	case u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(s, "?#"):
		return errdefs.Field(at, "must not include query or fragment")
	}
	return nil
}

// rejectCredentials refuses a credential-named member anywhere in a mount.
func rejectCredentials(at string, raw json.RawMessage) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return errdefs.Field(at, "must be a mount object")
	}
	var walk func(string, any) error
	walk = func(p string, v any) error {
		switch t := v.(type) {
		case map[string]any:
			for k, c := range t {
				if slices.Contains(forbiddenCredentialKeys, k) {
					return errdefs.Field(p+"."+k, "provider credentials must be supplied in mount_config.auth, not in a mount")
				}
				if err := walk(p+"."+k, c); err != nil {
					return err
				}
			}
		case []any:
			for i, c := range t {
				if err := walk(fmt.Sprintf("%s[%d]", p, i), c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(at, v)
}

func parseAuth(raw json.RawMessage) (Auth, error) {
	var mm map[string]json.RawMessage
	if err := strictObject(raw, &mm); err != nil {
		return Auth{}, errdefs.Field("mount_config.auth", "must be an object {aws?, gcp?}")
	}
	o := object{path: "mount_config.auth", m: mm}
	if err := o.only("aws", "gcp"); err != nil {
		return Auth{}, err
	}
	var a Auth
	aws, err := o.object("aws", false)
	if err != nil {
		return Auth{}, err
	}
	if aws.m != nil {
		if a.AWS, err = parseAWSAuth(aws); err != nil {
			return Auth{}, err
		}
	}
	gcp, err := o.object("gcp", false)
	if err != nil {
		return Auth{}, err
	}
	if gcp.m != nil {
		if err := gcp.only("service_account_json"); err != nil {
			return Auth{}, err
		}
		a.GCP = &GCPAuth{}
		if a.GCP.ServiceAccountJSON, err = gcp.secret("service_account_json"); err != nil {
			return Auth{}, err
		}
	}
	return a, nil
}

// parseAWSAuth reads auth.aws: {access_key_id, secret_access_key} or
// {role_arn, session_tags?}.
func parseAWSAuth(o object) (*AWSAuth, error) {
	a := &AWSAuth{From: o.path}
	if _, ok := o.present("role_arn"); !ok {
		if err := o.only("access_key_id", "secret_access_key"); err != nil {
			return nil, err
		}
		var err error
		if a.AccessKeyID, err = o.secret("access_key_id"); err != nil {
			return nil, err
		}
		a.SecretAccessKey, err = o.secret("secret_access_key")
		return a, err
	}
	if err := o.only("role_arn", "session_tags"); err != nil {
		return nil, errdefs.Field(o.path, "give role_arn (with optional session_tags) or access_key_id and secret_access_key, not both")
	}
	arn, err := o.str("role_arn", true)
	if err != nil {
		return nil, err
	}
	if err := awssts.CheckARN(arn); err != nil {
		return nil, errdefs.Field(o.path+".role_arn", "%v", err)
	}
	a.RoleARN = arn
	if r, ok := o.present("session_tags"); ok {
		if json.Unmarshal(r, &a.SessionTags) != nil {
			return nil, errdefs.Field(o.path+".session_tags", "must be an object of string values")
		}
		if err := awssts.CheckTags(a.SessionTags); err != nil {
			return nil, errdefs.Field(o.path+".session_tags", "%v", err)
		}
	}
	return a, nil
}

// proxyRule is the part of a proxy_config rule the mount rules look at.
type proxyRule struct {
	Type    string `json:"type"`
	Enabled *bool  `json:"enabled"`
	AWS     *struct {
		RoleARN         string            `json:"role_arn"`
		SessionTags     map[string]string `json:"session_tags"`
		AccessKeyID     json.RawMessage   `json:"access_key_id"`
		SecretAccessKey json.RawMessage   `json:"secret_access_key"`
	} `json:"aws"`
}

// checkProviders holds the cross rules: every mount's provider has auth,
// no auth block without a mount that uses it, and no provider both here
// and in a proxy_config rule. An S3 mount without auth.aws borrows the
// keys of an enabled aws proxy rule (spec §4.5).
func checkProviders(cfg *Config, proxyConfig []byte) error {
	var pc struct {
		Rules []proxyRule `json:"rules"`
	}
	if len(bytes.TrimSpace(proxyConfig)) > 0 {
		_ = json.Unmarshal(proxyConfig, &pc) // proxy_config is checked on its own
	}
	used := map[string]bool{}
	for _, m := range cfg.Mounts {
		used[m.Type] = true
	}
	for j, r := range pc.Rules {
		if r.Type == "aws" && cfg.Auth.AWS != nil || r.Type == "gcp" && cfg.Auth.GCP != nil {
			return errdefs.Field("mount_config.auth."+r.Type, "%s auth cannot be provided in both mount_config and proxy_config (proxy_config.rules[%d])", r.Type, j)
		}
	}
	if used[TypeS3] && cfg.Auth.AWS == nil {
		a, err := awsFromProxy(pc.Rules)
		if err != nil {
			return err
		}
		cfg.Auth.AWS = a
	}
	switch {
	case cfg.Auth.AWS != nil && !used[TypeS3]:
		return errdefs.Field("mount_config.auth.aws", "aws auth requires at least one s3 mount")
	case cfg.Auth.GCP != nil && !used[TypeGCS]:
		return errdefs.Field("mount_config.auth.gcp", "gcp auth requires at least one gcs mount")
	case used[TypeGCS] && cfg.Auth.GCP == nil:
		return errdefs.Field("mount_config.auth.gcp", "gcs mounts require gcp auth (service_account_json)")
	}
	return nil
}

// awsFromProxy takes S3 keys, or the role, of the first enabled aws rule.
func awsFromProxy(rules []proxyRule) (*AWSAuth, error) {
	for j, r := range rules {
		if r.Type != "aws" || r.Enabled != nil && !*r.Enabled || r.AWS == nil {
			continue
		}
		from, at := fmt.Sprintf("proxy_config.rules[%d]", j), fmt.Sprintf("proxy_config.rules[%d].aws", j)
		if r.AWS.RoleARN != "" {
			if err := awssts.CheckARN(r.AWS.RoleARN); err != nil {
				return nil, errdefs.Field(at+".role_arn", "%v", err)
			}
			return &AWSAuth{RoleARN: r.AWS.RoleARN, SessionTags: r.AWS.SessionTags, From: from}, nil
		}
		ak, err := parseSecret(at+".access_key_id", r.AWS.AccessKeyID, true)
		if err != nil {
			return nil, err
		}
		sk, err := parseSecret(at+".secret_access_key", r.AWS.SecretAccessKey, true)
		if err != nil {
			return nil, err
		}
		return &AWSAuth{AccessKeyID: ak, SecretAccessKey: sk, From: from}, nil
	}
	return nil, errdefs.Field("mount_config.auth.aws", "s3 mounts require aws auth (access_key_id and secret_access_key, or role_arn) in mount_config.auth or an enabled aws proxy_config rule")
}

// SecretNames lists the workspace secrets cfg references, each once.
func (c *Config) SecretNames() []string {
	var out []string
	add := func(s Secret) {
		if s.Type == "workspace_secret" && !slices.Contains(out, s.Value) {
			out = append(out, s.Value)
		}
	}
	switch a := c.Auth.AWS; {
	case a != nil && a.RoleARN != "":
		add(Secret{Type: "workspace_secret", Value: awssts.BaseAccessKeySecret})
		add(Secret{Type: "workspace_secret", Value: awssts.BaseSecretKeySecret})
	case a != nil:
		add(a.AccessKeyID)
		add(a.SecretAccessKey)
	}
	if g := c.Auth.GCP; g != nil {
		add(g.ServiceAccountJSON)
	}
	return out
}
