package api

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// FuzzDecode feeds arbitrary request bodies to the control plane's body
// decoder. It must not panic, and every refusal must be a client error the
// edge maps to a 4xx (ErrInvalid, a FieldError, or ErrTooLarge), never an
// unclassified one that would surface as a 500.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `"x"`, `{"name":"a","vcpus":2,"mem_bytes":1073741824}`,
		`{"vcpus":"two"}`, `{"proxy_config":{"access_control":{"allowlist":["x.com"]}}}`,
		`{"run_config":{"env":{"A":"B"},"user":"root"}}`, `{"name":"a"} trailing`, `{"name":`,
		`{"labels":{"k":` + strings.Repeat(`[`, 10000) + `}}`,
	} {
		f.Add([]byte(s))
	}
	f.Add(append([]byte(`{"name":"`), bytes.Repeat([]byte("a"), maxBody)...))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/v1/sandboxes", bytes.NewReader(body))
		var req protocol.CreateSandboxRequest
		err := decode(r, &req)
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
			t.Fatalf("decode(%.80q) = %v: not a client error", body, err)
		}
	})
}
