package store

import (
	"regexp"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/google/uuid"
)

// nameRE is what a sandbox, snapshot or registry name may be: it appears
// in URL paths and hostnames, so keep it to a DNS-label-like alphabet.
var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// ValidateName checks a record name given in request field field. A name
// never parses as a UUID (in any form uuid.Parse accepts): references take
// an id or a name, and a name shaped like another record's id would
// capture requests meant for it. Lookups also try the id first.
func ValidateName(field, name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Field(field, "must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	if _, err := uuid.Parse(name); err == nil {
		return errdefs.Field(field, "must not be a UUID: ids and names share one namespace in references")
	}
	return nil
}
