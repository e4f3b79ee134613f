package mounts

import (
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// FuzzParse: any mount_config and proxy_config either parse into mounts
// that hold the rules or are refused with a field error; never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{`+awsAuth+`,"mounts":[{"id":"a","type":"s3","mount_path":"/data","s3":{"bucket":"bkt"},"cache":{"writeback_seconds":3}}]}`), []byte(nil))
	f.Add([]byte(`{"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r","ref":{"type":"tag","name":"v1"}}}]}`), []byte(`{"rules":[]}`))
	f.Add([]byte(`{"mounts":[{"id":"a","type":"s3","mount_path":"/d","s3":{"bucket":"bkt"}}]}`), []byte(`{"rules":[{"type":"aws","aws":{"access_key_id":"a","secret_access_key":"b"}}]}`))
	f.Fuzz(func(t *testing.T, raw, proxy []byte) {
		cfg, err := Parse(raw, proxy)
		if err != nil {
			var fe *errdefs.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("not a field error: %v", err)
			}
			return
		}
		for _, m := range cfg.Mounts {
			if checkMountPath("p", m.Path) != nil || m.ID == "" {
				t.Fatalf("accepted a bad mount %+v", m)
			}
			if m.Type == TypeS3 && cfg.Auth.AWS == nil || m.Type == TypeGCS && cfg.Auth.GCP == nil || m.Type == TypeGit && !m.ReadOnly {
				t.Fatalf("accepted %+v with auth %+v", m, cfg.Auth)
			}
		}
	})
}
