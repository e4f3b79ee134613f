package e2e

import (
	"context"
	"crypto/md5"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/cubicle-dev/cubicle/internal/awssts/ststest"
	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// s3MountConfig mounts srv's bucket bkt at /data and again, read-only,
// at /ro, with secret as the secret key.
func s3MountConfig(srv *mountstest.S3, secret string) json.RawMessage {
	mount := func(id, path string, ro bool) string {
		return fmt.Sprintf(`{"id":%q,"type":"s3","mount_path":%q,"read_only":%t,"s3":{"endpoint_url":%q,"bucket":"bkt","path_style":true}}`,
			id, path, ro, srv.Endpoint)
	}
	return json.RawMessage(fmt.Sprintf(`{"auth":{"aws":{"access_key_id":{"type":"opaque","value":%q},"secret_access_key":{"type":"opaque","value":%q}}},"mounts":[%s,%s]}`,
		srv.AccessKey, secret, mount("data", "/data", false), mount("ro", "/ro", true)))
}

// TestS3Mount: an S3 bucket on a real S3 server (versitygw on loopback)
// mounted into a sandbox of each runtime: read, write, list, rename,
// read-only enforcement, no credential inside, the mount back after a
// stop/start and after a daemon restart, a wrong key failing the boot
// with the store's answer, and contexthub refused.
func TestS3Mount(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testS3Mount(t, rt) })
	}
}

func testS3Mount(t *testing.T, rt string) {
	srv := mountstest.StartS3(t, "bkt")
	srv.Put(t, "bkt", "hello.txt", []byte("from the bucket\n"))
	ref := testImage(t)
	d := startDaemonArgs(t, rt, "", "--mounts-allow-loopback")
	c := d.Client
	sn := readySnapshot(t, c, "busybox", ref)
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.MountConfig = s3MountConfig(srv, srv.SecretKey) })
	if !strings.Contains(sb.StatusMessage, "/data (s3) ok") {
		t.Fatalf("status message = %q", sb.StatusMessage)
	}
	if out := mustRun(t, c, sb.Name, "cat /data/hello.txt"); out != "from the bucket\n" {
		t.Fatalf("read = %q", out)
	}
	mustRun(t, c, sb.Name, "mkdir -p /data/out && echo written-inside > /data/out/a.txt && echo more >> /data/out/a.txt && mv /data/out/a.txt /data/out/b.txt")
	if b, _ := srv.Get(t, "bkt", "out/b.txt"); string(b) != "written-inside\nmore\n" {
		t.Fatalf("out/b.txt in the bucket = %q", b)
	}
	if _, ok := srv.Get(t, "bkt", "out/a.txt"); ok {
		t.Fatal("out/a.txt still in the bucket after mv")
	}
	if out := mustRun(t, c, sb.Name, "ls /data /data/out | tr '\\n' ' '"); !strings.Contains(out, "hello.txt") || !strings.Contains(out, "b.txt") {
		t.Fatalf("ls = %q", out)
	}
	if out, _, code := run(t, c, sb.Name, "echo x > /ro/new 2>&1; echo $?; cat /ro/hello.txt"); code != 0 || !strings.HasPrefix(out, "1\n") || !strings.Contains(out, "from the bucket") {
		t.Fatalf("read-only mount: %d %q", code, out)
	}
	credentialsAbsent(t, c, sb.Name, srv.SecretKey, srv.AccessKey)
	// Stop/start: the mount is served again.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.StopSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.StartSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, c, sb.Name, "cat /data/out/b.txt"); out != "written-inside\nmore\n" {
		t.Fatalf("after restart: %q", out)
	}
	// A daemon restart: the sandbox is restarted with its mounts served
	// by the new daemon.
	d.stop()
	d.restart()
	readyAfterRestart(t, c, sb.Name)
	mustRun(t, c, sb.Name, "echo again > /data/again.txt")
	if b, _ := srv.Get(t, "bkt", "again.txt"); string(b) != "again\n" {
		t.Fatalf("write after a daemon restart: %q", b)
	}
	// A wrong key fails the boot with the store's answer.
	_, err := c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: sn.ID, Name: "badkey", Timeout: int64p(60), MountConfig: s3MountConfig(srv, "wrong-secret")})
	bad, gerr := c.GetSandbox(ctx, "badkey")
	if err == nil || gerr != nil || bad.Status != protocol.StatusFailed || !strings.Contains(bad.StatusMessage, "SignatureDoesNotMatch") {
		t.Fatalf("create with a wrong key: %v; then %+v %v", err, bad, gerr)
	}
	// contexthub is a hosted feature: refused naming the field.
	_, err = c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: sn.ID, Name: "ch",
		MountConfig: json.RawMessage(`{"mounts":[{"id":"c","type":"contexthub","mount_path":"/c","contexthub":{"repo":"o/r"}}]}`)})
	if err == nil || !strings.Contains(err.Error(), "mount_config.mounts[0].type") || !strings.Contains(err.Error(), "not supported by this server") {
		t.Fatalf("contexthub: %v", err)
	}
}

// credentialsAbsent fails t if any of secrets is in the environment or the
// command line of a process of sandbox name, or in a file outside /proc,
// /sys, /dev and the mounts /data and /ro. The patterns go in halves
// through /data/.pat, so the command line searched holds none whole.
func credentialsAbsent(t *testing.T, c *cubicle.Client, name string, secrets ...string) {
	t.Helper()
	var format, halves string
	for _, s := range secrets {
		format += `%s%s\n`
		halves += " " + s[:len(s)/2] + " " + s[len(s)/2:]
	}
	probe := fmt.Sprintf(`printf '%s'%s > /data/.pat
(env; cat /proc/*/environ /proc/*/cmdline) 2>/dev/null | tr '\0' '\n' | grep -c -F -f /data/.pat
for d in /*; do case $d in /proc|/sys|/dev|/data|/ro) ;; *) grep -rslF -f /data/.pat $d;; esac; done | wc -l`, format, halves)
	if out, _, _ := run(t, c, name, probe); strings.Fields(out)[0] != "0" || strings.Fields(out)[1] != "0" {
		t.Fatalf("credentials found inside the sandbox (process matches, files): %q", out)
	}
	if out := mustRun(t, c, name, "grep -c -F -f /data/.pat /data/.pat"); strings.TrimSpace(out) != strconv.Itoa(len(secrets)) {
		t.Fatalf("the probe does not find its own patterns: %q", out)
	}
}

// TestS3MountRole: an S3 mount with auth.aws.role_arn in a gVisor sandbox
// is served with the credentials a fake STS grants the workspace's base
// keys (the store in front of versitygw takes only those), and neither
// the base nor the temporary credentials are inside the sandbox.
func TestS3MountRole(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	srv.Put(t, "bkt", "hello.txt", []byte("from the bucket\n"))
	base := aws.Credentials{AccessKeyID: "AKIAE2EBASEKEY", SecretAccessKey: "e2e-base-secret-key"}
	temp := aws.Credentials{AccessKeyID: "ASIAE2ETEMPKEY", SecretAccessKey: "e2e-temporary-secret", SessionToken: "e2e-session-token-0123"}
	sts := ststest.Start(t, base, temp, time.Hour)
	endpoint := srv.SessionFront(t, temp)
	d := startDaemonArgs(t, "gvisor", "", "--mounts-allow-loopback", "--egress-sts-endpoint", sts.URL)
	c := d.Client
	for name, v := range map[string]string{"AWS_ACCESS_KEY_ID": base.AccessKeyID, "AWS_SECRET_ACCESS_KEY": base.SecretAccessKey} {
		if code, b := apiAs(t, d, testKey, "PUT", "/secrets/"+name, map[string]string{"value": v}); code != 200 {
			t.Fatalf("put secret %s: %d %s", name, code, b)
		}
	}
	sn := readySnapshot(t, c, "busybox", testImage(t))
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.MountConfig = json.RawMessage(fmt.Sprintf(`{"auth":{"aws":{"role_arn":"arn:aws:iam::123456789012:role/data","session_tags":{"team":"blue"}}},
			"mounts":[{"id":"data","type":"s3","mount_path":"/data","s3":{"endpoint_url":%q,"bucket":"bkt","path_style":true}}]}`, endpoint))
	})
	if out := mustRun(t, c, sb.Name, "cat /data/hello.txt"); out != "from the bucket\n" {
		t.Fatalf("read = %q", out)
	}
	mustRun(t, c, sb.Name, "echo written-inside > /data/w.txt")
	if b, _ := srv.Get(t, "bkt", "w.txt"); string(b) != "written-inside\n" {
		t.Fatalf("w.txt in the bucket = %q", b)
	}
	calls := sts.Calls()
	if len(calls) != 1 || calls[0].Get("RoleSessionName") != "cubicle-"+sb.ID || calls[0].Get("Tags.member.1.Value") != "blue" {
		t.Fatalf("AssumeRole calls = %v", calls)
	}
	credentialsAbsent(t, c, sb.Name, base.AccessKeyID, base.SecretAccessKey, temp.AccessKeyID, temp.SecretAccessKey, temp.SessionToken)
}

// TestS3MountWritebackCrash: a write still waiting for its write-back
// (writeback_seconds 600) when the daemon is killed -9 is in the bucket,
// whole, by the time the restarted daemon has the sandbox ready again.
func TestS3MountWritebackCrash(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	d := startDaemonArgs(t, "gvisor", "", "--mounts-allow-loopback")
	c := d.Client
	sn := readySnapshot(t, c, "busybox", testImage(t))
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.MountConfig = json.RawMessage(fmt.Sprintf(`{"auth":{"aws":{"access_key_id":{"type":"opaque","value":%q},"secret_access_key":{"type":"opaque","value":%q}}},
			"mounts":[{"id":"data","type":"s3","mount_path":"/data","cache":{"writeback_seconds":600},"s3":{"endpoint_url":%q,"bucket":"bkt","path_style":true}}]}`,
			srv.AccessKey, srv.SecretKey, srv.Endpoint))
	})
	want := mustRun(t, c, sb.Name, "seq 1 200000 > /data/pending.txt && md5sum < /data/pending.txt")
	if _, ok := srv.Get(t, "bkt", "pending.txt"); ok {
		t.Fatal("uploaded before writeback_seconds")
	}
	d.kill9()
	d.restart()
	readyAfterRestart(t, c, sb.Name)
	b, ok := srv.Get(t, "bkt", "pending.txt")
	if !ok || fmt.Sprintf("%x  -\n", md5.Sum(b)) != want {
		t.Fatalf("pending.txt in the bucket: present %v, %d bytes, md5 %x; want md5 %q", ok, len(b), md5.Sum(b), want)
	}
	if out := mustRun(t, c, sb.Name, "md5sum < /data/pending.txt"); out != want {
		t.Fatalf("pending.txt inside after the restart: %q, want %q", out, want)
	}
}

// TestGCSMount: a GCS bucket on fake-gcs-server (the standard emulator)
// mounted into a gVisor sandbox with a service-account key held as a
// workspace secret: read, write, list and rename inside show in the
// bucket, and neither the key nor a token minted from it is inside.
func TestGCSMount(t *testing.T) {
	g := mountstest.StartGCS(t, "gbkt")
	g.Put(t, "gbkt", "pre/hello.txt", []byte("from gcs\n"))
	d := startDaemonArgs(t, "gvisor", "", "--mounts-allow-loopback", "--mounts-gcs-endpoint", g.Endpoint)
	c := d.Client
	if code, b := apiAs(t, d, testKey, "PUT", "/secrets/GCP_SA_KEY", map[string]string{"value": string(g.KeyJSON)}); code != 200 {
		t.Fatalf("put secret: %d %s", code, b)
	}
	sn := readySnapshot(t, c, "busybox", testImage(t))
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.MountConfig = json.RawMessage(`{"auth":{"gcp":{"service_account_json":{"type":"workspace_secret","value":"{GCP_SA_KEY}"}}},
			"mounts":[{"id":"g","type":"gcs","mount_path":"/data","gcs":{"bucket":"gbkt","prefix":"pre"}}]}`)
	})
	if !strings.Contains(sb.StatusMessage, "/data (gcs) ok") {
		t.Fatalf("status message = %q", sb.StatusMessage)
	}
	if out := mustRun(t, c, sb.Name, "cat /data/hello.txt"); out != "from gcs\n" {
		t.Fatalf("read = %q", out)
	}
	mustRun(t, c, sb.Name, "echo written-inside > /data/a.txt && mv /data/a.txt /data/b.txt")
	if b, ok := g.Get(t, "gbkt", "pre/b.txt"); !ok || string(b) != "written-inside\n" {
		t.Fatalf("pre/b.txt in the bucket = %q (present %v)", b, ok)
	}
	if _, ok := g.Get(t, "gbkt", "pre/a.txt"); ok {
		t.Fatal("pre/a.txt still in the bucket after mv")
	}
	if out := mustRun(t, c, sb.Name, "ls /data | tr '\\n' ' '"); out != "b.txt hello.txt " {
		t.Fatalf("ls = %q", out)
	}
	var key struct {
		PrivateKey string `json:"private_key"`
	}
	if err := json.Unmarshal(g.KeyJSON, &key); err != nil {
		t.Fatal(err)
	}
	credentialsAbsent(t, c, sb.Name, strings.Split(key.PrivateKey, "\n")[3], "test-token")
}

// TestS3MountMemoryStop: a gVisor sandbox with an S3 mount stopped with
// its memory is restored from it with the mount served again, and the
// branches of a memory fork get the same mount.
func TestS3MountMemoryStop(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	d := startDaemonArgs(t, "gvisor", "", "--mounts-allow-loopback")
	c := d.Client
	sn := readySnapshot(t, c, "busybox", testImage(t))
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.MountConfig = s3MountConfig(srv, srv.SecretKey)
		r.PreserveMemoryOnStop = ptrBool(true)
	})
	mustRun(t, c, sb.Name, "echo before > /data/m.txt; setsid sleep 100000 </dev/null >/dev/null 2>&1 &")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.StopSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	srv.Put(t, "bkt", "while-stopped.txt", []byte("new\n"))
	if err := c.StartSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetSandbox(ctx, sb.Name)
	if err != nil || strings.Contains(got.StatusMessage, "memory not restored") {
		t.Fatalf("start after a memory stop: %+v %v", got, err)
	}
	if out := mustRun(t, c, sb.Name, "pidof sleep > /dev/null && echo alive; cat /data/m.txt /data/while-stopped.txt"); out != "alive\nbefore\nnew\n" {
		t.Fatalf("after restore: %q", out)
	}
	// Branches of a memory fork are restored with the same mounts.
	fr, err := c.Fork(ctx, sb.Name, protocol.ForkRequest{Count: 2, IncludeMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range fr.Sandboxes {
		mustRun(t, c, b.Name, fmt.Sprintf("echo branch%d > /data/branch%d.txt", i, i))
		if out := mustRun(t, c, b.Name, "pidof sleep > /dev/null && echo alive; cat /data/m.txt"); out != "alive\nbefore\n" {
			t.Fatalf("branch %s: %q", b.Name, out)
		}
	}
	for i := range fr.Sandboxes {
		if b, _ := srv.Get(t, "bkt", fmt.Sprintf("branch%d.txt", i)); string(b) != fmt.Sprintf("branch%d\n", i) {
			t.Fatalf("branch%d.txt in the bucket = %q", i, b)
		}
	}
}

// TestGitMountGVisor: a git repository on a real git HTTPS server (git
// http-backend, its CA given with --egress-ca-file) checked out read-only
// into a gVisor sandbox, and a new commit showing up in place.
func TestGitMountGVisor(t *testing.T) {
	g := mountstest.StartGit(t)
	g.Commit(t, "main", "f.txt", "v1")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, g.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonArgs(t, "gvisor", "", "--egress-ca-file", ca, "--mounts-allow-loopback")
	c := d.Client
	sn := readySnapshot(t, c, "busybox", testImage(t))
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.MountConfig = json.RawMessage(fmt.Sprintf(`{"mounts":[{"id":"r","type":"git","mount_path":"/repo","git":{"remote_url":%q,"ref":{"type":"branch","name":"main"},"refresh_interval_seconds":1}}]}`,
			g.URL+"/repo.git"))
	})
	if out := mustRun(t, c, sb.Name, "cat /repo/f.txt"); out != "v1" {
		t.Fatalf("f.txt = %q", out)
	}
	if out, _, _ := run(t, c, sb.Name, "echo x > /repo/f.txt 2>/dev/null; echo $?; cat /repo/f.txt"); out != "1\nv1" {
		t.Fatalf("write to the read-only checkout: %q", out)
	}
	g.Commit(t, "main", "f.txt", "v2")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := mustRun(t, c, sb.Name, "cat /repo/f.txt")
		if out == "v2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("f.txt = %q after a refresh, want v2", out)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// readyAfterRestart waits up to 90 s for sandbox name to be ready again
// after a daemon restart brought it back.
func readyAfterRestart(t *testing.T, c *cubicle.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := c.WaitSandbox(ctx, name); err != nil {
		t.Fatalf("not ready after a daemon restart: %v", err)
	}
}
