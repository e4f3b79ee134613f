package sandbox

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func i64(v int64) *int64 { return &v }

func fieldOf(err error) string {
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

func TestTTLValidationFollowsGranularity(t *testing.T) {
	for _, c := range []struct {
		v     int64
		unit  int64
		valid bool
	}{
		{0, 60, true}, {60, 60, true}, {1200, 60, true}, {61, 60, false}, {30, 60, false}, {-60, 60, false},
		{1, 1, true}, {7, 1, true}, {-1, 1, false}, {maxTTLSeconds + 60, 60, false},
	} {
		err := validateTTL("idle_ttl_seconds", i64(c.v), c.unit)
		if (err == nil) != c.valid || (err != nil && fieldOf(err) != "idle_ttl_seconds") {
			t.Errorf("ttl %d unit %d: %v, valid=%v", c.v, c.unit, err, c.valid)
		}
	}
	m := &Manager{cfg: Config{TTLGranularity: time.Second}}
	if m.ttlUnit() != 1 {
		t.Fatalf("1s granularity gives unit %d", m.ttlUnit())
	}
	if (&Manager{cfg: Config{TTLGranularity: time.Minute}}).ttlUnit() != 60 {
		t.Fatal("default TTL unit is not 60")
	}
}

func TestValidateUpdateRequest(t *testing.T) {
	name, bad := "new-name", "bad name"
	for _, c := range []struct {
		req   protocol.UpdateSandboxRequest
		field string
	}{
		{protocol.UpdateSandboxRequest{Name: &name, IdleTTLSeconds: i64(120)}, ""},
		{protocol.UpdateSandboxRequest{Name: &bad}, "name"},
		{protocol.UpdateSandboxRequest{DeleteAfterStopSeconds: i64(90)}, "delete_after_stop_seconds"},
		{protocol.UpdateSandboxRequest{RunConfig: &protocol.RunConfig{WorkDir: "x"}}, "run_config.work_dir"},
		{protocol.UpdateSandboxRequest{ProxyConfig: json.RawMessage(`{"access_control":{"allow_list":["a.com"]}}`)}, ""},
		{protocol.UpdateSandboxRequest{ProxyConfig: json.RawMessage(`[1]`)}, "proxy_config"},
		{protocol.UpdateSandboxRequest{ProxyConfig: json.RawMessage(`{"rules":[1]}`)}, "proxy_config.rules"},
		{protocol.UpdateSandboxRequest{ProxyConfig: json.RawMessage(`{"rules":{}}`)}, "proxy_config"},
		{protocol.UpdateSandboxRequest{ProxyConfig: json.RawMessage(`{"access_control":{"allow_list":[],"deny_list":[]}}`)}, "proxy_config.access_control"},
		{protocol.UpdateSandboxRequest{VCPUs: i64(DefaultLimits.MaxVCPUs + 1)}, "vcpus"},
		{protocol.UpdateSandboxRequest{MemBytes: i64(1 << 20)}, "mem_bytes"},
		{protocol.UpdateSandboxRequest{FSCapacityBytes: i64(0)}, "fs_capacity_bytes"},
		{protocol.UpdateSandboxRequest{VCPUs: i64(4), MemBytes: i64(2 << 30)}, ""},
	} {
		err := validateUpdateRequest(c.req, DefaultLimits, 60)
		if got := fieldOf(err); got != c.field || (c.field == "" && err != nil) {
			t.Errorf("%+v: error %v (field %q), want field %q", c.req, err, got, c.field)
		}
	}
	if (protocol.UpdateSandboxRequest{VCPUs: i64(1)}).Empty() {
		t.Error("a resize alone is not an empty update")
	}
	if !(protocol.UpdateSandboxRequest{ProxyConfig: json.RawMessage("null")}).Empty() {
		t.Error("a null proxy_config alone should be an empty update")
	}
}

// TestNamesNeverParseAsUUIDs: a sandbox, snapshot or registry named like
// another record's id would capture requests meant for it (DELETE
// /boxes/<id>), so every form uuid.Parse accepts is refused on create,
// rename and capture, naming the field.
func TestNamesNeverParseAsUUIDs(t *testing.T) {
	id := "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	for _, name := range []string{id, "3F2504E0-4F89-41D3-9A0C-0305E82C3301", "3f2504e04f8941d39a0c0305e82c3301"} {
		if err := validateSandboxRequest(protocol.CreateSandboxRequest{Name: name}, LimitPolicy{}, 1); fieldOf(err) != "name" {
			t.Errorf("create %q: %v", name, err)
		}
		if err := validateUpdateRequest(protocol.UpdateSandboxRequest{Name: &name}, DefaultLimits, 1); fieldOf(err) != "name" {
			t.Errorf("rename to %q: %v", name, err)
		}
		if err := validateSnapshotRequest(protocol.CreateSnapshotRequest{Name: name, DockerImage: "x", FSCapacityBytes: 1}, LimitPolicy{MaxFSBytes: 2}); fieldOf(err) != "name" {
			t.Errorf("snapshot %q: %v", name, err)
		}
		if err := validateCaptureRequest(protocol.CaptureSnapshotRequest{Name: name}, LimitPolicy{}); fieldOf(err) != "name" {
			t.Errorf("capture %q: %v", name, err)
		}
	}
	for _, name := range []string{"box-1", "3f2504e0-4f89-41d3-9a0c", "deadbeef"} {
		if err := store.ValidateName("name", name); err != nil {
			t.Errorf("%q refused: %v", name, err)
		}
	}
}
