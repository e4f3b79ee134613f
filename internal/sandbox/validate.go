package sandbox

import (
	"path"
	"regexp"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// nameRE is what a sandbox or snapshot name may be: it appears in URL paths
// and hostnames, so keep it to a DNS-label-like alphabet.
var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// envNameRE is what an environment variable name may be.
var envNameRE = regexp.MustCompile(`^[^=\x00]+$`)

func validateName(field, name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Field(field, "must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	return nil
}

func validateRunConfig(field string, rc *protocol.RunConfig) error {
	if rc == nil {
		return nil
	}
	if rc.WorkDir != "" && !path.IsAbs(rc.WorkDir) {
		return errdefs.Field(field+".work_dir", "must be an absolute path")
	}
	for k := range rc.EnvVars {
		if !envNameRE.MatchString(k) {
			return errdefs.Field(field+".env_vars", "invalid variable name %q", k)
		}
	}
	return nil
}

func validateTTL(field string, v *int64) error {
	if v != nil && (*v < 0 || *v%60 != 0) {
		return errdefs.Field(field, "must be 0 or a positive multiple of 60")
	}
	return nil
}

func validateSize(field string, v *int64, max int64) error {
	if v == nil {
		return nil
	}
	if *v <= 0 {
		return errdefs.Field(field, "must be positive")
	}
	if *v > max {
		return errdefs.Field(field, "must be at most %d", max)
	}
	return nil
}

func validateSnapshotRequest(req protocol.CreateSnapshotRequest, lim LimitPolicy) error {
	if err := validateName("name", req.Name); err != nil {
		return err
	}
	if req.DockerImage == "" {
		return errdefs.Field("docker_image", "is required")
	}
	fs := req.FSCapacityBytes
	if err := validateSize("fs_capacity_bytes", &fs, lim.MaxFSBytes); err != nil {
		return err
	}
	return validateRunConfig("run_config", req.RunConfig)
}

func validateSandboxRequest(req protocol.CreateSandboxRequest, lim LimitPolicy) error {
	if req.Name != "" {
		if err := validateName("name", req.Name); err != nil {
			return err
		}
	}
	if req.SnapshotID != "" && req.SnapshotName != "" {
		return errdefs.Field("snapshot_name", "give snapshot_id or snapshot_name, not both")
	}
	if req.Timeout != nil && (*req.Timeout < 0 || *req.Timeout > 3600) {
		return errdefs.Field("timeout", "must be between 0 and 3600 seconds")
	}
	for _, c := range []struct {
		field string
		v     *int64
		max   int64
	}{
		{"vcpus", req.VCPUs, lim.MaxVCPUs},
		{"mem_bytes", req.MemBytes, lim.MaxMemBytes},
		{"fs_capacity_bytes", req.FSCapacityBytes, lim.MaxFSBytes},
	} {
		if err := validateSize(c.field, c.v, c.max); err != nil {
			return err
		}
	}
	if req.MemBytes != nil && *req.MemBytes < 16<<20 {
		return errdefs.Field("mem_bytes", "must be at least 16 MiB")
	}
	if err := validateTTL("idle_ttl_seconds", req.IdleTTLSeconds); err != nil {
		return err
	}
	if err := validateTTL("delete_after_stop_seconds", req.DeleteAfterStopSeconds); err != nil {
		return err
	}
	return validateRunConfig("run_config", req.RunConfig)
}
