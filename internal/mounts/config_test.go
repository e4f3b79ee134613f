package mounts

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

const awsAuth = `"auth":{"aws":{"access_key_id":{"type":"opaque","value":"AK"},"secret_access_key":{"type":"workspace_secret","value":"{S3_SECRET}"}}}`

func TestParseGood(t *testing.T) {
	cfg, err := Parse([]byte(`{`+awsAuth+`,"mounts":[
		{"id":"a","type":"s3","mount_path":"/data","s3":{"bucket":"my-bucket","prefix":"p/q","region":"eu-west-1","path_style":true,"encryption":{"kms_key":"k1"}},"read_only":true,"cache":{"max_size_bytes":2097152,"writeback_seconds":5}},
		{"id":"g","type":"git","mount_path":"/repo","git":{"remote_url":"https://example.com/o/r.git","ref":{"type":"tag","name":"v1.0"},"refresh_interval_seconds":30}}]}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Mounts[0]
	if s.S3.EndpointURL != defaultS3Endpoint || s.S3.Prefix != "p/q/" || s.S3.Region != "eu-west-1" || !s.S3.PathStyle || s.S3.KMSKey != "k1" ||
		!s.ReadOnly || s.Cache != (Cache{MaxSizeBytes: 2 << 20, WritebackSeconds: 5}) {
		t.Fatalf("s3 mount = %+v %+v", s, s.S3)
	}
	g := cfg.Mounts[1]
	if !g.ReadOnly || *g.Git != (Git{RemoteURL: "https://example.com/o/r.git", RefType: "tag", RefName: "v1.0", RefreshSeconds: 30}) {
		t.Fatalf("git mount = %+v %+v", g, g.Git)
	}
	if names := cfg.SecretNames(); len(names) != 1 || names[0] != "S3_SECRET" {
		t.Fatalf("secret names = %v", names)
	}
	// An S3 mount may borrow the keys of an enabled aws proxy rule.
	cfg, err = Parse([]byte(`{"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`),
		[]byte(`{"rules":[{"name":"r","type":"aws","enabled":true,"aws":{"access_key_id":"AK","secret_access_key":{"type":"opaque","value":"SK"}}}]}`))
	if err != nil || cfg.Auth.AWS.AccessKeyID.Value != "AK" || cfg.Auth.AWS.SecretAccessKey.Value != "SK" {
		t.Fatalf("borrowed aws auth: %+v, %v", cfg, err)
	}
	// A role is assumed with the workspace's base keys: those are the
	// secrets it needs. Its own or a proxy rule's, with session tags.
	const arn = "arn:aws:iam::123456789012:role/data"
	for _, tc := range []struct{ cfg, proxy, from string }{
		{`{"auth":{"aws":{"role_arn":"` + arn + `","session_tags":{"team":"blue"}}},"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, "", "mount_config.auth.aws"},
		{`{"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, `{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"` + arn + `","session_tags":{"team":"blue"}}}]}`, "proxy_config.rules[0]"},
	} {
		cfg, err = Parse([]byte(tc.cfg), []byte(tc.proxy))
		if err != nil {
			t.Fatal(err)
		}
		if a := cfg.Auth.AWS; a.RoleARN != arn || a.SessionTags["team"] != "blue" || a.From != tc.from || a.AccessKeyID != (Secret{}) {
			t.Fatalf("role auth = %+v", a)
		}
		if names := cfg.SecretNames(); !slices.Equal(names, []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}) {
			t.Fatalf("role auth's secret names = %v", names)
		}
	}
}

// TestParseBad: every invalid member is a 422 naming it.
func TestParseBad(t *testing.T) {
	s3 := func(s3, extra string) string {
		return `{` + awsAuth + `,"mounts":[{"id":"a","type":"s3","mount_path":"/data","s3":{` + s3 + `}` + extra + `}]}`
	}
	git := func(g string) string {
		return `{"mounts":[{"id":"g","type":"git","mount_path":"/repo","git":{` + g + `}}]}`
	}
	role := func(aws string) string {
		return `{"auth":{"aws":{` + aws + `}},"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`
	}
	const m0 = "mount_config.mounts[0]"
	for _, tc := range []struct{ cfg, proxy, field, msg string }{
		{`[]`, "", "mount_config", "object"},
		{`{"mounts":[]}`, "", "mount_config.mounts", "non-empty"},
		{`{"mounts":[{}]}`, "", m0, "mount object"},
		{`{"mounts":[],"extra":1}`, "", "mount_config.extra", "unknown"},
		{`{"mounts":[{"id":"c","type":"contexthub","mount_path":"/c","contexthub":{"repo":"o/r"}}]}`, "", m0 + ".type", "not supported by this server"},
		{`{"mounts":[{"id":"c","type":"nfs","mount_path":"/c"}]}`, "", m0 + ".type", "one of"},
		{s3(`"bucket":"b1x"`, `,"id":""`), "", m0 + ".id", ""},
		{s3(`"bucket":"bkt"`, `,"mount_path":"data"`), "", m0 + ".mount_path", "absolute"},
		{s3(`"bucket":"bkt"`, `,"mount_path":"/proc/x"`), "", m0 + ".mount_path", "runtime"},
		{s3(`"bucket":"bkt"`, `,"mount_path":"/a/../b"`), "", m0 + ".mount_path", "clean"},
		{s3(``, ""), "", m0 + ".s3.bucket", "required"},
		{s3(`"bucket":"Bad_Bucket"`, ""), "", m0 + ".s3.bucket", "bucket name"},
		{s3(`"bucket":"bkt","region":""`, ""), "", m0 + ".s3.region", "non-empty"},
		{s3(`"bucket":"bkt","region":"Not A Region"`, ""), "", m0 + ".s3.region", "region"},
		{s3(`"bucket":"bkt","endpoint_url":"ftp://x"`, ""), "", m0 + ".s3.endpoint_url", "http"},
		{s3(`"bucket":"bkt","endpoint_url":"https://u:p@x"`, ""), "", m0 + ".s3.endpoint_url", "credentials"},
		{s3(`"bucket":"bkt","prefix":"/abs"`, ""), "", m0 + ".s3.prefix", "relative"},
		{s3(`"bucket":"bkt","prefix":"a/../b"`, ""), "", m0 + ".s3.prefix", ".."},
		{s3(`"bucket":"bkt","path_style":"yes"`, ""), "", m0 + ".s3.path_style", "boolean"},
		{s3(`"bucket":"bkt","encryption":{"kms_key":""}`, ""), "", m0 + ".s3.encryption.kms_key", ""},
		{s3(`"bucket":"bkt","encryption":{"algo":"x"}`, ""), "", m0 + ".s3.encryption.algo", "unknown"},
		{s3(`"bucket":"bkt","access_key_id":"AK"`, ""), "", m0 + ".s3.access_key_id", "mount_config.auth"},
		{s3(`"bucket":"bkt"`, `,"credentials":{}`), "", m0 + ".credentials", "mount_config.auth"},
		{s3(`"bucket":"bkt"`, `,"read_only":1`), "", m0 + ".read_only", "boolean"},
		{s3(`"bucket":"bkt"`, `,"cache":{"max_size_bytes":10}`), "", m0 + ".cache.max_size_bytes", "at least"},
		{s3(`"bucket":"bkt"`, `,"cache":{"writeback_seconds":-1}`), "", m0 + ".cache.writeback_seconds", "between"},
		{s3(`"bucket":"bkt"`, `,"cache":{"ttl":1}`), "", m0 + ".cache.ttl", "unknown"},
		{s3(`"bucket":"bkt"`, `,"gcs":{}`), "", m0 + ".gcs", "unknown"},
		{`{"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, "", "mount_config.auth.aws", "require aws auth"},
		{`{"mounts":[{"id":"a","type":"gcs","mount_path":"/d","gcs":{"bucket":"bkt"}}]}`, "", "mount_config.auth.gcp", "require gcp auth"},
		{`{"auth":{"gcp":{"service_account_json":{"type":"opaque","value":"{}"}}},"mounts":[{"id":"a","type":"gcs","mount_path":"/d","gcs":{"bucket":"B!"}}]}`, "", m0 + ".gcs.bucket", "GCS bucket"},
		{`{"auth":{"gcp":{"service_account_json":{"type":"opaque","value":"{}"}}},"mounts":[{"id":"a","type":"gcs","mount_path":"/d","gcs":{"bucket":"bkt","prefix":"//"}}]}`, "", m0 + ".gcs.prefix", ""},
		{`{` + awsAuth + `,"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r"}}]}`, "", "mount_config.auth.aws", "at least one s3 mount"},
		{`{"auth":{"gcp":{"service_account_json":{"type":"opaque","value":"k"}}},"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r"}}]}`, "", "mount_config.auth.gcp", "at least one gcs mount"},
		{s3(`"bucket":"bkt"`, ""), `{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::123456789012:role/x"}}]}`, "mount_config.auth.aws", "both"},
		{role(`"role_arn":"arn:aws:iam::12:role/x"`), "", "mount_config.auth.aws.role_arn", "IAM role ARN"},
		{role(`"role_arn":""`), "", "mount_config.auth.aws.role_arn", "non-empty"},
		{role(`"role_arn":"arn:aws:iam::123456789012:role/x","access_key_id":{"type":"opaque","value":"x"}`), "", "mount_config.auth.aws", "not both"},
		{role(`"role_arn":"arn:aws:iam::123456789012:role/x","session_tags":{"team":1}`), "", "mount_config.auth.aws.session_tags", "string values"},
		{role(`"role_arn":"arn:aws:iam::123456789012:role/x","session_tags":{"":"v"}`), "", "mount_config.auth.aws.session_tags", "keys are"},
		{s3(`"bucket":"bkt"`, ""), `{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::1:role/x"}}]}`, "mount_config.auth.aws", "both"},
		{`{"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, `{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::1:role/x"}}]}`, "proxy_config.rules[0].aws.role_arn", "IAM role ARN"},
		{`{"auth":{"aws":{"access_key_id":{"type":"plain","value":"x"},"secret_access_key":{"type":"opaque","value":"y"}}},"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, "", "mount_config.auth.aws.access_key_id.type", "workspace_secret or opaque"},
		{`{"auth":{"aws":{"access_key_id":{"type":"workspace_secret","value":"NAME"},"secret_access_key":{"type":"opaque","value":"y"}}},"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, "", "mount_config.auth.aws.access_key_id.value", "{NAME}"},
		{`{"auth":{"aws":{"access_key_id":{"type":"opaque","value":"x"}}},"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, "", "mount_config.auth.aws.secret_access_key", "required"},
		{`{"auth":{"aws":{"access_key_id":"x","secret_access_key":"y"}},"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`, "", "mount_config.auth.aws.access_key_id", "secret"},
		{`{"auth":{"azure":{}},"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r"}}]}`, "", "mount_config.auth.azure", "unknown"},
		{git(`"remote_url":"http://h/r"`), "", m0 + ".git.remote_url", "HTTPS"},
		{git(`"remote_url":"https://u:p@h/r"`), "", m0 + ".git.remote_url", "credentials"},
		{git(`"remote_url":"https://h/"`), "", m0 + ".git.remote_url", "repository path"},
		{git(`"remote_url":"https://h/r?x=1"`), "", m0 + ".git.remote_url", "query"},
		{git(`"remote_url":"https://h/r#f"`), "", m0 + ".git.remote_url", "fragment"},
		{git(`"remote_url":"https://h/r x"`), "", m0 + ".git.remote_url", "whitespace"},
		{git(`"remote_url":"https://h/r","ref":{"type":"commit","name":"x"}`), "", m0 + ".git.ref.type", "branch or tag"},
		{git(`"remote_url":"https://h/r","ref":{"type":"branch","name":""}`), "", m0 + ".git.ref.name", ""},
		{git(`"remote_url":"https://h/r","ref":{"type":"branch","name":"-x"}`), "", m0 + ".git.ref.name", "ref name"},
		{git(`"remote_url":"https://h/r","refresh_interval_seconds":0`), "", m0 + ".git.refresh_interval_seconds", "between"},
		{git(`"remote_url":"https://h/r","refresh_interval_seconds":1.5`), "", m0 + ".git.refresh_interval_seconds", "integer"},
		{`{"mounts":[{"id":"g","type":"git","mount_path":"/r","read_only":false,"git":{"remote_url":"https://h/r"}}]}`, "", m0 + ".read_only", "read-only"},
		{`{"mounts":[{"id":"g","type":"git","mount_path":"/r","cache":{},"git":{"remote_url":"https://h/r"}}]}`, "", m0 + ".cache", "unknown"},
		{`{"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r"}},{"id":"g","type":"git","mount_path":"/s","git":{"remote_url":"https://h/r"}}]}`, "", "mount_config.mounts[1].id", "twice"},
		{`{"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r"}},{"id":"h","type":"git","mount_path":"/r/s","git":{"remote_url":"https://h/r"}}]}`, "", "mount_config.mounts[1].mount_path", "overlaps"},
	} {
		_, err := Parse([]byte(tc.cfg), []byte(tc.proxy))
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
			t.Errorf("Parse(%s): %v, want a field error on %s containing %q", tc.cfg, err, tc.field, tc.msg)
		}
	}
}

// fakeSecrets holds values (by name, any workspace); allowed are the names
// MayUse allows.
type fakeSecrets struct {
	allowed map[string]bool
	values  map[string]string
}

func (f fakeSecrets) Secret(_ context.Context, _, name string) ([]byte, error) {
	v, ok := f.values[name]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return []byte(v), nil
}
func (f fakeSecrets) MayUse(_ context.Context, _ auth.Principal, name string) error {
	if !f.allowed[name] {
		return errdefs.ErrForbidden
	}
	return nil
}

// TestValidateSecrets: a workspace secret the caller may not use is refused.
func TestValidateSecrets(t *testing.T) {
	cfg := []byte(`{` + awsAuth + `,"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`)
	svc, err := New(Options{Dir: t.TempDir(), Secrets: fakeSecrets{allowed: map[string]bool{}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Validate(context.Background(), auth.Principal{}, cfg, nil); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("Validate with a forbidden secret: %v", err)
	}
	svc.opt.Secrets = fakeSecrets{allowed: map[string]bool{"S3_SECRET": true}}
	if paths, err := svc.Validate(context.Background(), auth.Principal{}, cfg, nil); err != nil || len(paths) != 1 || paths[0] != "/d" {
		t.Fatalf("Validate = %v, %v; want the mount's path /d", paths, err)
	}
	svc.opt.Secrets = nil
	var fe *errdefs.FieldError
	if _, err := svc.Validate(context.Background(), auth.Principal{}, cfg, nil); !errors.As(err, &fe) || fe.Field != "mount_config.auth" {
		t.Fatalf("Validate without a vault: %v", err)
	}
}
