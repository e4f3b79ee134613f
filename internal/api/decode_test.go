package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestDecodeUnknownFields: a member the request type does not model is
// refused with its full path, at every depth, including inside the raw
// proxy_config; known members (any case, as encoding/json matches them)
// pass.
func TestDecodeUnknownFields(t *testing.T) {
	for _, c := range []struct {
		body string
		want string // "" = accepted
	}{
		{`{"name":"a","snapshot_id":"s"}`, ""},
		{`{"Name":"a"}`, ""},
		{``, ""},
		{`null`, ""},
		{`{"nmae":"a"}`, "nmae"},
		{`{"":{}}`, `""`},
		{`{"run_config":{"":1}}`, `run_config.""`},
		{`{"run_config":{"user":"0","workdir":"/x"}}`, "run_config.workdir"},
		{`{"run_config":{"env_vars":{"ANY_KEY":"v"}}}`, ""},
		{`{"proxy_config":{"access_control":{"allowlist":["x.com"]}}}`, "proxy_config.access_control.allowlist"},
		{`{"proxy_config":{"access_control":{"allow_list":["x.com"]}}}`, ""},
		{`{"proxy_config":{"rules":[{"name":"r","match_hosts":["a.com"],"headers":[{"name":"H","value":"v"}]},{"name":"r2","headrs":[]}]}}`, "proxy_config.rules[1].headrs"},
		{`{"proxy_config":{"rules":[{"name":"r","headers":[{"name":"H","value":{"type":"opaque","value":"v","extra":1}}]}]}}`, "proxy_config.rules[0].headers[0].value.extra"},
		{`{"proxy_config":{"rules":[{"type":"aws","aws":{"access_key_id":{"type":"workspace_secret","value":"{K}"},"secret_access_key":"{S}"},"env_vars":{"AWS_REGION":"x"}}],"no_proxy":["x"]}}`, ""},
		{`{"proxy_config":{"rules":[{"type":"aws","aws":{"role_arn":"r","session":"x"}}]}}`, "proxy_config.rules[0].aws.session"},
		{`{"proxy_config":{"callbacks":[{"url":"https://cb.example/x","match_hosts":["a.com"],"ttl_seconds":60,"full_request":true,"request_headers":["X-A"]}]}}`, ""},
		{`{"proxy_config":{"callbacks":[{"url":"https://cb.example/x","match_host":["a.com"]}]}}`, "proxy_config.callbacks[0].match_host"},
		{`{"proxy_config":{"rules":[{"type":"aws","aws":{"role_arn":"r","session_tags":{"k":"v"}}}]}}`, ""},
		{`{"proxy_config":null}`, ""},
		{`{"mount_config":{"mounts":[]},"access_delegation":{"mode":"INHERIT"},"snapshot":"base"}`, ""},
		{`{"access_delegation":{"mode":"INHERIT","permisions":[]}}`, "access_delegation.permisions"},
	} {
		var req protocol.CreateSandboxRequest
		err := decodeBytes([]byte(c.body), &req)
		var ue *unknownFieldError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.body, err)
		case c.want != "" && !errors.As(err, &ue):
			t.Errorf("%s: got %v, want unknown field %s", c.body, err, c.want)
		case c.want != "" && ue.path != c.want:
			t.Errorf("%s: unknown field %q, want %q", c.body, ue.path, c.want)
		case c.want != "" && !errors.Is(err, errdefs.ErrInvalid):
			t.Errorf("%s: %v is not ErrInvalid", c.body, err)
		}
	}
}

// TestDecodeErrors: wrong types name the field, malformed JSON and
// non-objects are invalid, an oversize body is too large.
func TestDecodeErrors(t *testing.T) {
	var req protocol.CreateSandboxRequest
	var fe *errdefs.FieldError
	if err := decodeBytes([]byte(`{"vcpus":"two"}`), &req); !errors.As(err, &fe) || fe.Field != "vcpus" {
		t.Fatalf("wrong type: %v", err)
	}
	if err := decodeBytes([]byte(`{"run_config":{"env_vars":{"A":1}}}`), &req); !errors.As(err, &fe) || fe.Field != "run_config.env_vars" {
		t.Fatalf("nested wrong type: %v", err)
	}
	for _, body := range []string{`{"name":`, `[1]`, `"x"`, `{"name":"a"} trailing`} {
		if err := decodeBytes([]byte(body), &req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("%q: %v, want ErrInvalid", body, err)
		}
	}
	r := httptest.NewRequest("POST", "/", strings.NewReader(`{"name":"`+strings.Repeat("a", maxBody)+`"}`))
	if err := decode(r, &req); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("oversize: %v, want ErrTooLarge", err)
	}
}

// FuzzDecode: the decoder never panics, every refusal is a client error
// the edge maps to a 4xx (ErrInvalid, a FieldError, or ErrTooLarge; never
// an unclassified one that would surface as a 500), and it agrees with
// encoding/json's own DisallowUnknownFields on what it checks too
// (everything outside raw members): a body it accepts the strict standard
// decoder accepts, and a body the standard decoder refuses for an unknown
// field it refuses.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","run_config":{"user":"0","env_vars":{"A":"b"}}}`,
		`{"proxy_config":{"access_control":{"allowlist":["x"]}}}`,
		`{"proxy_config":{"rules":[{"headers":[{"name":"H","value":{"type":"opaque","value":"v"}}]}]}}`,
		`{"NAME":"a","Run_Config":{}}`, `{"x":1}`, `[]`, `null`, `{"vcpus":1e400}`,
		``, `{}`, `"x"`, `{"vcpus":"two"}`, `{"name":"a"} trailing`, `{"name":`,
		`{"labels":{"k":` + strings.Repeat(`[`, 10000) + `}}`,
	} {
		f.Add([]byte(s))
	}
	f.Add(append([]byte(`{"name":"`), bytes.Repeat([]byte("a"), maxBody)...))
	f.Fuzz(func(t *testing.T, body []byte) {
		var ours protocol.CreateSandboxRequest
		err := decode(httptest.NewRequest("POST", "/boxes", bytes.NewReader(body)), &ours)
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
			t.Fatalf("decode(%.80q) = %v: not a client error", body, err)
		}
		if errors.Is(err, errdefs.ErrTooLarge) {
			return
		}
		var std protocol.CreateSandboxRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		stdErr := dec.Decode(&std)
		if stdErr == nil && dec.More() {
			stdErr = errors.New("trailing data")
		}
		if len(bytes.TrimSpace(body)) == 0 {
			return
		}
		if err == nil && stdErr != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, stdErr)
		}
		if stdErr != nil && strings.Contains(stdErr.Error(), "unknown field") && err == nil {
			t.Fatalf("accepted %q with an unknown field", body)
		}
	})
}
