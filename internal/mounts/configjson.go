package mounts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/proxy"
)

// Reading mount_config's JSON member by member, so that every error
// names the member at fault.

// parseSecret reads a Secret {type: workspace_secret|opaque, value}. With
// plain, a bare string (a proxy rule's plaintext form) is an opaque value.
func parseSecret(at string, raw json.RawMessage, plain bool) (Secret, error) {
	var s string
	if plain && json.Unmarshal(raw, &s) == nil {
		if strings.TrimSpace(s) == "" {
			return Secret{}, errdefs.Field(at, "must not be empty")
		}
		return Secret{Type: "opaque", Value: s}, nil
	}
	var mm map[string]json.RawMessage
	if err := strictObject(raw, &mm); err != nil {
		return Secret{}, errdefs.Field(at, "must be a secret {type, value}")
	}
	o := object{path: at, m: mm}
	if err := o.only("type", "value"); err != nil {
		return Secret{}, err
	}
	typ, err := o.str("type", true)
	if err != nil {
		return Secret{}, err
	}
	val, err := o.str("value", true)
	if err != nil {
		return Secret{}, err
	}
	switch typ {
	case "opaque", "plaintext":
		return Secret{Type: "opaque", Value: val}, nil
	case "workspace_secret":
		name, ok := strings.CutPrefix(val, "{")
		name, ok2 := strings.CutSuffix(name, "}")
		if !ok || !ok2 || !proxy.ValidSecretName(name) {
			return Secret{}, errdefs.Field(at+".value", "a workspace_secret value is {NAME} (got %q)", val)
		}
		return Secret{Type: typ, Value: name}, nil
	}
	return Secret{}, errdefs.Field(at+".type", "must be workspace_secret or opaque")
}

// object is a JSON object being checked, with its path for errors.
type object struct {
	path string
	m    map[string]json.RawMessage
}

func strictObject(raw []byte, into *map[string]json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return fmt.Errorf("not an object")
	}
	return json.Unmarshal(raw, into)
}

// only refuses members other than names.
func (o object) only(names ...string) error {
	keys := make([]string, 0, len(o.m))
	for k := range o.m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(names, k) {
			return errdefs.Field(o.path+"."+k, "unknown member (allowed: %s)", strings.Join(names, ", "))
		}
	}
	return nil
}

func (o object) present(k string) (json.RawMessage, bool) {
	r, ok := o.m[k]
	if !ok || string(bytes.TrimSpace(r)) == "null" {
		return nil, false
	}
	return r, true
}

// str reads a string member; a present one must be non-blank.
func (o object) str(k string, required bool) (string, error) {
	r, ok := o.present(k)
	if !ok {
		if required {
			return "", errdefs.Field(o.path+"."+k, "is required")
		}
		return "", nil
	}
	var s string
	if err := json.Unmarshal(r, &s); err != nil {
		return "", errdefs.Field(o.path+"."+k, "must be a string")
	}
	if strings.TrimSpace(s) == "" {
		return "", errdefs.Field(o.path+"."+k, "must be a non-empty string")
	}
	return strings.TrimSpace(s), nil
}

func (o object) boolean(k string) (v, set bool, err error) {
	r, ok := o.present(k)
	if !ok {
		return false, false, nil
	}
	if err := json.Unmarshal(r, &v); err != nil {
		return false, false, errdefs.Field(o.path+"."+k, "must be a boolean")
	}
	return v, true, nil
}

func (o object) integer(k string) (int64, bool, error) {
	r, ok := o.present(k)
	if !ok {
		return 0, false, nil
	}
	var n int64
	if err := json.Unmarshal(r, &n); err != nil {
		return 0, false, errdefs.Field(o.path+"."+k, "must be an integer")
	}
	return n, true, nil
}

// object reads an object member (m nil when absent and not required).
func (o object) object(k string, required bool) (object, error) {
	sub := object{path: o.path + "." + k}
	r, ok := o.present(k)
	if !ok {
		if required {
			return sub, errdefs.Field(sub.path, "is required")
		}
		return sub, nil
	}
	if err := strictObject(r, &sub.m); err != nil {
		return sub, errdefs.Field(sub.path, "must be an object")
	}
	return sub, nil
}

func (o object) secret(k string) (Secret, error) {
	r, ok := o.present(k)
	if !ok {
		return Secret{}, errdefs.Field(o.path+"."+k, "is required")
	}
	return parseSecret(o.path+"."+k, r, false)
}
