package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestVolumeCmds: volume create, ls, snapshot and rm, and sandbox create
// --volume, send what the API takes; a bad --volume is refused before any
// request.
func TestVolumeCmds(t *testing.T) {
	got := recordingAPI(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == "/v2/sandboxes/volumes" && r.Method == http.MethodGet:
			json.NewEncoder(w).Encode(protocol.VolumeList{Volumes: []protocol.Volume{{Name: "data", SizeBytes: 1 << 30,
				Attachments: []protocol.VolumeUse{{SandboxName: "box", MountPath: "/data", ReadOnly: true}}}}})
		case r.URL.Path == "/v2/sandboxes/boxes":
			json.NewEncoder(w).Encode(protocol.Sandbox{Name: "box", Status: "ready"})
		case strings.HasSuffix(r.URL.Path, "/snapshot"):
			json.NewEncoder(w).Encode(protocol.VolumeSnapshot{Name: "s1"})
		default:
			json.NewEncoder(w).Encode(protocol.Volume{Name: "data"})
		}
	})
	for _, c := range []struct {
		args []string
		want string // in stdout
	}{
		{[]string{"volume", "create", "data", "--size", "1GiB"}, "data"},
		{[]string{"volume", "create", "copy", "--from-snapshot", "s1"}, "data"},
		{[]string{"volume", "ls"}, "box:/data:ro"},
		{[]string{"volume", "snapshot", "data", "s1"}, "s1"},
		{[]string{"volume", "rm", "data"}, ""},
		{[]string{"volume", "rm", "--snapshot", "s1"}, ""},
		{[]string{"sandbox", "create", "--volume", "data:/data", "--volume", "ref:/ref:ro"}, "box"},
	} {
		cmd := newVolumeCmd()
		if c.args[0] == "sandbox" {
			cmd = newSandboxCreateCmd()
			c.args = c.args[1:]
		}
		out, _, err := runCmd(cmd, "", c.args[1:]...)
		if err != nil || !strings.Contains(out, c.want) {
			t.Fatalf("%v: %q %v, want %q in it", c.args, out, err, c.want)
		}
	}
	for _, bad := range []string{"data", "data:/d:rx", ":/d"} {
		if _, _, err := runCmd(newSandboxCreateCmd(), "", "--volume", bad); err == nil {
			t.Fatalf("--volume %s was accepted", bad)
		}
	}
	want := []string{
		`POST /v2/sandboxes/volumes {"name":"data","size_bytes":1073741824}`,
		`POST /v2/sandboxes/volumes {"name":"copy","from_snapshot":"s1"}`,
		`GET /v2/sandboxes/volumes `,
		`POST /v2/sandboxes/volumes/data/snapshot {"name":"s1"}`,
		`DELETE /v2/sandboxes/volumes/data `,
		`DELETE /v2/sandboxes/volume-snapshots/s1 `,
	}
	if len(*got) != len(want)+1 || strings.Join((*got)[:len(want)], "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(*got, "\n"), strings.Join(want, "\n"))
	}
	if create := (*got)[len(want)]; !strings.Contains(create, `"volumes":[{"name":"data","mount_path":"/data"},{"name":"ref","mount_path":"/ref","read_only":true}]`) {
		t.Fatalf("sandbox create sent %s", create)
	}
}
