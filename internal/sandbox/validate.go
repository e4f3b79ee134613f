package sandbox

import (
	"bytes"
	"encoding/json"
	"path"
	"regexp"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// envNameRE is what an environment variable name may be.
var envNameRE = regexp.MustCompile(`^[^=\x00]+$`)

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

// maxTTLSeconds bounds both TTLs (one year), so they fit any duration math.
const maxTTLSeconds = 365 * 24 * 3600

// validateTTL checks a TTL is 0 (off) or a positive multiple of unit
// seconds (60, as the protocol says, unless the daemon runs with a finer
// --ttl-granularity for tests).
func validateTTL(field string, v *int64, unit int64) error {
	if v == nil {
		return nil
	}
	if *v < 0 || *v%unit != 0 {
		return errdefs.Field(field, "must be 0 or a positive multiple of %d", unit)
	}
	if *v > maxTTLSeconds {
		return errdefs.Field(field, "must be at most %d", maxTTLSeconds)
	}
	return nil
}

// ttlUnit is the TTL granularity in whole seconds (at least 1).
func (m *Manager) ttlUnit() int64 {
	if u := int64(m.cfg.TTLGranularity / 1e9); u > 1 {
		return u
	}
	return 1
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
	if err := store.ValidateName("name", req.Name); err != nil {
		return err
	}
	if req.DockerImage == "" {
		return errdefs.Field("docker_image", "is required")
	}
	fs := req.FSCapacityBytes
	if err := validateSize("fs_capacity_bytes", &fs, lim.MaxFSBytes); err != nil {
		return err
	}
	if err := validateLabels("labels", req.Labels); err != nil {
		return err
	}
	return validateRunConfig("run_config", req.RunConfig)
}

func validateSandboxRequest(req protocol.CreateSandboxRequest, lim LimitPolicy, ttlUnit int64) error {
	if req.Name != "" {
		if err := store.ValidateName("name", req.Name); err != nil {
			return err
		}
	}
	if req.SnapshotID != "" && req.SnapshotName != "" {
		return errdefs.Field("snapshot_name", "give snapshot_id or snapshot_name, not both")
	}
	if req.Timeout != nil && (*req.Timeout < 0 || *req.Timeout > 3600) {
		return errdefs.Field("timeout", "must be between 0 and 3600 seconds")
	}
	if err := validateResources(req.VCPUs, req.MemBytes, req.FSCapacityBytes, lim); err != nil {
		return err
	}
	if err := validateTTL("idle_ttl_seconds", req.IdleTTLSeconds, ttlUnit); err != nil {
		return err
	}
	if err := validateTTL("delete_after_stop_seconds", req.DeleteAfterStopSeconds, ttlUnit); err != nil {
		return err
	}
	if err := validateLabels("labels", req.Labels); err != nil {
		return err
	}
	if len(req.TagValueIDs) > 0 {
		return errNoResourceTags
	}
	if req.Persistent != nil && !*req.Persistent && req.PreserveMemoryOnStop != nil && *req.PreserveMemoryOnStop {
		return errdefs.Field("preserve_memory_on_stop", "requires a persistent sandbox (persistent: false discards the filesystem at every stop)")
	}
	if err := validateRunConfig("env_vars", &protocol.RunConfig{EnvVars: req.EnvVars}); err != nil {
		return err
	}
	return validateRunConfig("run_config", req.RunConfig)
}

// checkDocker refuses docker: true on a runtime d that cannot host
// Docker, before anything else of the request is looked up.
func checkDocker(d runtime.Driver, docker *bool) error {
	if docker == nil || !*docker {
		return nil
	}
	if _, ok := d.(runtime.DockerHost); !ok {
		return errdefs.Field("docker", "the %s runtime cannot run Docker inside a sandbox (use the gvisor runtime)", d.Name())
	}
	return nil
}

// dockerOf is the Docker-inside opt-in of a sandbox created from sn on
// runtime d: asked (docker, when not nil, already checked), else sn's,
// which a runtime that cannot host Docker refuses.
func dockerOf(d runtime.Driver, docker *bool, sn *store.Snapshot) (bool, error) {
	if docker != nil {
		return *docker, nil
	}
	if !sn.Docker {
		return false, nil
	}
	if _, ok := d.(runtime.DockerHost); !ok {
		return false, errdefs.Field("docker", "snapshot %s runs Docker inside, which the %s runtime cannot (create with docker: false to boot it without)", sn.Name, d.Name())
	}
	return true, nil
}

// dockerKeepsNoMemory refuses memory snapshots and memory-preserving
// stops of sandboxes with Docker inside: gVisor's restore rebuilds the
// network stack from the new netns, which drops the bridge and veths
// dockerd made, so a restored dockerd could no longer start a bridged
// container (measured: "could not find bridge docker0").
func dockerKeepsNoMemory(field string) error {
	return errdefs.Field(field, "a sandbox with Docker inside cannot keep its memory (a restore rebuilds its network stack without Docker's bridge); stop and start it cold")
}

// errNoResourceTags refuses tag_value_ids: Cubicle has no LangSmith
// resource tags to attach.
var errNoResourceTags = errdefs.Field("tag_value_ids", "resource tags are not supported by this server; use labels")

// minMilliCPUs is the least CPU a sandbox may ask for.
const minMilliCPUs = 100

// reconcileCPU returns the vCPUs a request asks for given its vcpus and
// cpu_millicores: millicores, when given, set the vCPUs to their round-up
// (which quotas count; the runtime enforces the exact millicores), and
// vcpus given as well must be that round-up.
func reconcileCPU(vcpus, millis *int64, lim LimitPolicy) (*int64, error) {
	if millis == nil {
		return vcpus, nil
	}
	if *millis < minMilliCPUs || *millis > lim.MaxVCPUs*1000 {
		return nil, errdefs.Field("cpu_millicores", "must be between %d and %d", minMilliCPUs, lim.MaxVCPUs*1000)
	}
	n := (*millis + 999) / 1000
	if vcpus != nil && *vcpus != n {
		return nil, errdefs.Field("cpu_millicores", "%d millicores round up to %d vCPUs but vcpus is %d: give one of them, or make them agree", *millis, n, *vcpus)
	}
	return &n, nil
}

// withEnvVars returns rc with a create request's top-level env_vars
// merged into its env_vars; a variable in both with different values is
// refused.
func withEnvVars(rc *protocol.RunConfig, env map[string]string) (*protocol.RunConfig, error) {
	if len(env) == 0 {
		return rc, nil
	}
	out := protocol.RunConfig{}.Layer(rc)
	if out.EnvVars == nil {
		out.EnvVars = map[string]string{}
	}
	for k, v := range env {
		if old, ok := out.EnvVars[k]; ok && old != v {
			return nil, errdefs.Field("env_vars."+k, "run_config.env_vars sets it to another value; set it in one place")
		}
		out.EnvVars[k] = v
	}
	return &out, nil
}

// validateResources checks the resources a create or resize asks for
// (nil: unchanged or the default) against the policy's maxima.
func validateResources(vcpus, memBytes, fsBytes *int64, lim LimitPolicy) error {
	for _, c := range []struct {
		field string
		v     *int64
		max   int64
	}{
		{"vcpus", vcpus, lim.MaxVCPUs},
		{"mem_bytes", memBytes, lim.MaxMemBytes},
		{"fs_capacity_bytes", fsBytes, lim.MaxFSBytes},
	} {
		if err := validateSize(c.field, c.v, c.max); err != nil {
			return err
		}
	}
	if memBytes != nil && *memBytes < 16<<20 {
		return errdefs.Field("mem_bytes", "must be at least 16 MiB")
	}
	return nil
}

// validateUpdateRequest checks a PATCH body's fields (not the sandbox's
// state, which the manager checks under the sandbox's lock).
func validateUpdateRequest(req protocol.UpdateSandboxRequest, lim LimitPolicy, ttlUnit int64) error {
	if err := validateResources(req.VCPUs, req.MemBytes, req.FSCapacityBytes, lim); err != nil {
		return err
	}
	if err := validateLabels("labels", req.Labels); err != nil {
		return err
	}
	if len(req.TagValueIDs) > 0 {
		return errNoResourceTags
	}
	if req.Name != nil {
		if err := store.ValidateName("name", *req.Name); err != nil {
			return err
		}
	}
	if err := validateTTL("idle_ttl_seconds", req.IdleTTLSeconds, ttlUnit); err != nil {
		return err
	}
	if err := validateTTL("delete_after_stop_seconds", req.DeleteAfterStopSeconds, ttlUnit); err != nil {
		return err
	}
	if err := validateRunConfig("run_config", req.RunConfig); err != nil {
		return err
	}
	return validateProxyConfig(req.ProxyConfig)
}

// proxyConfigShape is the part of ProxyConfig (spec §4.4) checked here;
// enforcement (and a full schema) belongs to the network layer.
type proxyConfigShape struct {
	Rules         []json.RawMessage `json:"rules"`
	AccessControl *struct {
		AllowList []string `json:"allow_list"`
		DenyList  []string `json:"deny_list"`
	} `json:"access_control"`
	NoProxy []string `json:"no_proxy"`
}

// maxProxyConfig bounds a stored proxy config.
const maxProxyConfig = 256 << 10

func validateProxyConfig(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if len(raw) > maxProxyConfig {
		return errdefs.Field("proxy_config", "must be at most %d bytes", maxProxyConfig)
	}
	if raw[0] != '{' {
		return errdefs.Field("proxy_config", "must be an object")
	}
	var pc proxyConfigShape
	if err := json.Unmarshal(raw, &pc); err != nil {
		return errdefs.Field("proxy_config", "invalid: %v", err)
	}
	for i, r := range pc.Rules {
		if r = bytes.TrimSpace(r); len(r) == 0 || r[0] != '{' {
			return errdefs.Field("proxy_config.rules", "rule %d must be an object", i)
		}
	}
	if ac := pc.AccessControl; ac != nil && ac.AllowList != nil && ac.DenyList != nil {
		return errdefs.Field("proxy_config.access_control", "give allow_list or deny_list, not both")
	}
	return nil
}
