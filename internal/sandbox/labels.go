package sandbox

import (
	"maps"
	"regexp"
	"strings"
	"unicode"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Label bounds: at most maxLabels per record; a key is a Kubernetes
// qualified name (an optional DNS-subdomain prefix of ≤ 253 characters
// and "/", then ≤ 63 characters of letters, digits, '-', '_' and '.',
// beginning and ending with a letter or digit); a value is ≤
// maxLabelValue bytes of UTF-8 without control characters.
const (
	maxLabels     = 64
	maxLabelValue = 256
)

var (
	labelNameRE   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelPrefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// tagRE is a Docker tag.
	tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ValidateLabelKey checks one label key (see maxLabels); field names it in
// the error.
func ValidateLabelKey(field, k string) error {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		prefix, name = "", k
	} else if len(prefix) > 253 || !labelPrefixRE.MatchString(prefix) {
		return errdefs.Field(field, "label key %q: the prefix before '/' must be a DNS subdomain of at most 253 characters", k)
	}
	if !labelNameRE.MatchString(name) {
		return errdefs.Field(field, "label key %q: the name must be 1-63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit", k)
	}
	return nil
}

// validateLabels checks a labels map of a request member named field.
func validateLabels(field string, labels map[string]string) error {
	if len(labels) > maxLabels {
		return errdefs.Field(field, "at most %d labels", maxLabels)
	}
	for k, v := range labels {
		if err := ValidateLabelKey(field, k); err != nil {
			return err
		}
		if len(v) > maxLabelValue || strings.ContainsFunc(v, unicode.IsControl) {
			return errdefs.Field(field+"."+k, "must be at most %d bytes with no control characters", maxLabelValue)
		}
	}
	return nil
}

// layerLabels returns base with over applied key by key (a new map, never
// nil), refused with a 422 naming field when the result has too many.
func layerLabels(field string, base, over map[string]string) (map[string]string, error) {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, over)
	if len(out) > maxLabels {
		return nil, errdefs.Field(field, "at most %d labels, the snapshot's included", maxLabels)
	}
	return out, nil
}

// snapshotTag returns the tag a create or capture asks for: "latest"
// when none.
func snapshotTag(tag string) (string, error) {
	if tag == "" {
		return "latest", nil
	}
	if !tagRE.MatchString(tag) {
		return "", errdefs.Field("tag", "must be a Docker tag: 1-128 letters, digits, '_', '.' or '-', not beginning with '.' or '-'")
	}
	return tag, nil
}

// SplitSnapshotRef splits a Docker-style snapshot reference name[:tag];
// tag is "" for a bare name.
func SplitSnapshotRef(ref string) (name, tag string) {
	name, tag, _ = strings.Cut(ref, ":")
	return name, tag
}
