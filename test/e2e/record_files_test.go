package e2e

import (
	"context"
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// stepFiles waits for step's file.changed event (until timeout) and
// returns it with the step's package events; none at timeout is nil.
func stepFiles(t *testing.T, c *cubicle.Client, name string, step int64, timeout time.Duration) (*protocol.FileChanges, []string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		st, err := c.AuditStep(ctx, name, step)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		var fc *protocol.FileChanges
		var pkgs []string
		for _, e := range st.Events {
			switch e.Kind {
			case protocol.KindFile:
				fc = new(protocol.FileChanges)
				if err := json.Unmarshal(e.Data, fc); err != nil {
					t.Fatal(err)
				}
			case protocol.KindPackage:
				var p protocol.PackageChange
				json.Unmarshal(e.Data, &p)
				pkgs = append(pkgs, strings.Join([]string{e.Type, p.Ecosystem, p.Name, p.Version}, " "))
			}
		}
		if fc != nil || time.Now().After(deadline) {
			return fc, pkgs
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lastStep is the step of the newest command.started in name's record.
func lastStep(t *testing.T, c *cubicle.Client, name string) int64 {
	t.Helper()
	list, err := c.Audit(context.Background(), name, cubicle.AuditOptions{Kinds: []string{protocol.KindCommand}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for i := len(list.Items) - 1; i >= 0; i-- {
		if e := list.Items[i]; e.Type == protocol.EventCommandStarted {
			return e.Step
		}
	}
	t.Fatal("no command in the record")
	return 0
}

func addedPaths(fc *protocol.FileChanges) []string {
	var out []string
	for _, a := range fc.Added {
		out = append(out, a.Path)
	}
	return out
}

// TestAuditFiles runs commands through the real daemon (namespace
// runtime, btrfs-loop store) and checks each step's file events list
// exactly the paths it created, modified and deleted, a command touching
// nothing has none, and a simulated package install (dpkg status stanza,
// dist-info dir, node_modules manifest) shows as package.installed
// events. It also measures what the scans cost: a no-op exec round trip
// with and without them, and the record latency of a 10,000-file command.
func TestAuditFiles(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "namespace", "")
	c := d.Client
	sn := readySnapshot(t, c, "auditfiles", ref)
	sb := newSandbox(t, c, sn.ID, nil)

	step := func(command string) (int64, *protocol.FileChanges, []string) {
		t.Helper()
		mustRun(t, c, sb.Name, command)
		s := lastStep(t, c, sb.Name)
		fc, pkgs := stepFiles(t, c, sb.Name, s, 5*time.Second)
		return s, fc, pkgs
	}

	if _, fc, _ := step("true"); fc != nil {
		t.Fatalf("true changed files: %+v", fc)
	}
	_, fc, _ := step("mkdir -p /data && echo hi > /data/a && echo x > /data/b && chmod 600 /data/b")
	if fc == nil || !reflect.DeepEqual(addedPaths(fc), []string{"/data", "/data/a", "/data/b"}) || fc.ModifiedCount+fc.DeletedCount != 0 {
		t.Fatalf("create step: %+v", fc)
	}
	if fc.Added[2].Mode != "-rw-------" || fc.Added[1].Size != 3 {
		t.Fatalf("create step sizes/modes: %+v", fc.Added)
	}
	_, fc, _ = step("echo more >> /data/a && chmod 640 /data/a && rm /data/b && mv /data/a /data/c")
	if fc == nil || !reflect.DeepEqual(addedPaths(fc), []string{"/data/c"}) || !reflect.DeepEqual(fc.Deleted, []string{"/data/a", "/data/b"}) {
		t.Fatalf("rename/delete step: %+v", fc)
	}
	_, fc, _ = step("echo again >> /data/c && chmod 600 /data/c")
	if fc == nil || len(fc.Modified) != 1 {
		t.Fatalf("modify step: %+v", fc)
	}
	if m := fc.Modified[0]; m.Path != "/data/c" || m.SizeBefore == nil || *m.SizeBefore != 8 || m.Size != 14 ||
		m.ModeBefore != "-rw-r-----" || m.Mode != "-rw-------" {
		t.Fatalf("modify step: %+v", m)
	}

	// A package install, simulated (no network): dpkg's status gains a
	// stanza, pip's dist-info dir and npm's manifest appear.
	_, fc, pkgs := step(`mkdir -p /var/lib/dpkg /usr/lib/python3/dist-packages/foo-1.2.dist-info /app/node_modules/left-pad &&
printf 'Package: hello\nStatus: install ok installed\nVersion: 2.10-3\nArchitecture: amd64\n\n' >> /var/lib/dpkg/status &&
echo 'Name: foo' > /usr/lib/python3/dist-packages/foo-1.2.dist-info/METADATA &&
echo '{"name":"left-pad","version":"1.3.0"}' > /app/node_modules/left-pad/package.json`)
	sort.Strings(pkgs)
	want := []string{"package.installed dpkg hello 2.10-3", "package.installed npm left-pad 1.3.0", "package.installed pip foo 1.2"}
	if fc == nil || !reflect.DeepEqual(pkgs, want) {
		t.Fatalf("package step: %v (files %+v)", pkgs, fc)
	}

	// A command writing 10,000 files: its record is complete well within 1 s
	// of its exit reaching the client.
	// The next command is sent only once this one's scan is done: none of
	// its writes count as this step's.
	mustRun(t, c, sb.Name, "mkdir /many")
	mkdirStep := lastStep(t, c, sb.Name)
	start := time.Now()
	mustRun(t, c, sb.Name, `cd /many && i=0; while [ $i -lt 10000 ]; do : > f$i; i=$((i+1)); done`)
	exited := time.Now()
	fc, _ = stepFiles(t, c, sb.Name, lastStep(t, c, sb.Name), 10*time.Second)
	latency := time.Since(exited)
	if fc == nil || fc.AddedCount != 10000 || len(fc.Added) != 1000 || !fc.Truncated {
		list, _ := c.Audit(context.Background(), sb.Name, cubicle.AuditOptions{Kinds: []string{protocol.KindFile}, Limit: 1000})
		for _, e := range list.Items {
			t.Logf("file event %d of step %d: %.300s", e.Seq, e.Step, e.Data)
		}
		t.Fatalf("10,000-file step: %+v", fc)
	}
	if fc, _ := stepFiles(t, c, sb.Name, mkdirStep, time.Second); fc == nil || !reflect.DeepEqual(addedPaths(fc), []string{"/many"}) {
		t.Fatalf("mkdir step: %+v", fc)
	}
	t.Logf("10,000-file command: ran %v, record complete %v after its exit", exited.Sub(start), latency)
	if latency > time.Second {
		t.Errorf("10,000-file record took %v, over 1 s", latency)
	}

	on := roundTrips(t, c, sb.Name)
	off := startDaemonArgs(t, "namespace", "", "--audit-files=false")
	osb := newSandbox(t, off.Client, readySnapshot(t, off.Client, "auditfiles", ref).ID, nil)
	offRT := roundTrips(t, off.Client, osb.Name)
	t.Logf("exec round trip of true, median: %v with file scans, %v without (+%v)", on, offRT, on-offRT)
	if on-offRT > 5*time.Millisecond {
		t.Errorf("file scans add %v to a no-op command", on-offRT)
	}
}

// roundTrips is the median exec round trip of `true` in sandbox name.
func roundTrips(t *testing.T, c *cubicle.Client, name string) time.Duration {
	var ds []time.Duration
	for range 60 {
		start := time.Now()
		mustRun(t, c, name, "true")
		ds = append(ds, time.Since(start))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}
