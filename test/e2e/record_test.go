package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestAuditRecord runs a short agent session through the real daemon and
// checks its audit record: exactly the lifecycle events and commands, in
// order, with their exit codes, kill and output; env names but never their
// values, nor the API key; the record survives kill -9 of the daemon; and
// follow=true delivers a new command's events live.
func TestAuditRecord(t *testing.T) {
	const secret = "s3cret-value-9f2c"
	ref := testImage(t)
	d := startDaemon(t, "namespace", "")
	c := d.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sn := readySnapshot(t, c, "audit", ref)
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "audited" })

	exec := func(req cubicle.ExecRequest) (string, string, int, error) {
		var out, errb bytes.Buffer
		req.Shell, req.Stdout, req.Stderr = "/bin/sh", &out, &errb
		code, err := c.Exec(ctx, sb.Name, req)
		return out.String(), errb.String(), code, err
	}
	if out, _, code, err := exec(cubicle.ExecRequest{Command: "echo hello"}); err != nil || code != 0 || out != "hello\n" {
		t.Fatalf("echo: %q %d %v", out, code, err)
	}
	if _, _, code, err := exec(cubicle.ExecRequest{Command: "echo oops >&2; exit 3"}); err != nil || code != 3 {
		t.Fatalf("failing command: %d %v", code, err)
	}
	if _, _, _, err := exec(cubicle.ExecRequest{Command: "sleep 30", Timeout: time.Second}); !errors.Is(err, cubicle.ErrCommandTimeout) {
		t.Fatalf("timed-out command: %v", err)
	}
	envCmd := `printf %s "$SECRET_TOKEN" | wc -c`
	if out, _, code, err := exec(cubicle.ExecRequest{Command: envCmd,
		RunConfig: &protocol.RunConfig{EnvVars: map[string]string{"SECRET_TOKEN": secret}}}); err != nil || code != 0 || strings.TrimSpace(out) != "17" {
		t.Fatalf("env command: %q %d %v", out, code, err)
	}
	const bigCmd = `head -c 3145728 /dev/zero | tr '\0' a; echo END`
	if out, _, code, err := exec(cubicle.ExecRequest{Command: bigCmd}); err != nil || code != 0 || len(out) != 3<<20+4 {
		t.Fatalf("big output: %d bytes, %d %v", len(out), code, err)
	}
	if out, _, code, err := exec(cubicle.ExecRequest{Command: "echo on-a-tty", PTY: true}); err != nil || code != 0 || !strings.Contains(out, "on-a-tty") {
		t.Fatalf("PTY command: %q %d %v", out, code, err)
	}
	if res, err := c.Run(ctx, sb.Name, "printf abc"); err != nil || res.Stdout != "abc" {
		t.Fatalf("HTTP execute: %+v %v", res, err)
	}
	if err := c.WriteFile(ctx, sb.Name, "/tmp/up.txt", strings.NewReader("uploaded")); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ReadFile(ctx, sb.Name, "/tmp/up.txt")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(rc); string(b) != "uploaded" {
		t.Fatalf("download: %q", b)
	}
	rc.Close()
	if err := c.StopSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.StartSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}

	// Everything was recorded at most 200 ms ago: a crash now loses nothing.
	time.Sleep(300 * time.Millisecond)
	d.kill9()
	d.restart()
	c = d.Client

	list, err := c.Audit(ctx, sb.Name, cubicle.AuditOptions{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	steps := map[string]int64{} // command → step
	for _, e := range list.Items {
		if e.Type == protocol.EventFileChanged {
			continue // what the upload left, at stop: TestAuditFiles covers file events
		}
		got = append(got, e.Type)
		if e.Type == protocol.EventCommandStarted {
			var d struct{ Command string }
			json.Unmarshal(e.Data, &d)
			steps[d.Command] = e.Step
		}
		if e.Actor.User == "" || e.Actor.User == protocol.ActorSystem {
			t.Errorf("event %d %s has actor %+v, want the API key's user", e.Seq, e.Type, e.Actor)
		}
	}
	cmd := []string{protocol.EventCommandStarted, protocol.EventCommandExited}
	want := append([]string{protocol.EventCreated, protocol.EventStarted}, cmd...)
	want = append(want, cmd...)
	want = append(want, protocol.EventCommandStarted, protocol.EventCommandKilled, protocol.EventCommandExited)
	for range 4 { // env, big output, PTY, HTTP
		want = append(want, cmd...)
	}
	want = append(want, protocol.EventFileUploaded, protocol.EventFileDownloaded, protocol.EventStopped, protocol.EventStarted)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("record after kill -9:\n got %v\nwant %v", got, want)
	}
	for i, e := range list.Items {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}

	exited := func(command string) (*protocol.AuditStep, map[string]any) {
		t.Helper()
		st, err := c.AuditStep(ctx, sb.Name, steps[command])
		if err != nil {
			t.Fatalf("step of %q: %v", command, err)
		}
		var d map[string]any
		json.Unmarshal(st.Events[len(st.Events)-1].Data, &d)
		return st, d
	}
	if st, d := exited("echo hello"); d["exit_code"] != 0.0 || st.Stdout == nil || st.Stdout.Head != "hello\n" || d["stdout_bytes"] != 6.0 {
		t.Fatalf("echo step: %+v %v", st, d)
	}
	if st, d := exited("echo oops >&2; exit 3"); d["exit_code"] != 3.0 || st.Stderr == nil || st.Stderr.Head != "oops\n" {
		t.Fatalf("failing step: %+v %v", st, d)
	}
	if _, d := exited("sleep 30"); d["exit_code"] != nil || d["killed"] != "timeout" || d["error"] != protocol.ErrCommandTimeout {
		t.Fatalf("timed-out step: %v", d)
	}
	if st, d := exited(bigCmd); d["stdout_bytes"] != float64(3<<20+4) || st.Stdout == nil || !st.Stdout.Truncated ||
		len(st.Stdout.Head) != 512<<10 || !strings.HasSuffix(st.Stdout.Tail, "aaaEND\n") || len(st.Stdout.Tail) != 512<<10 {
		t.Fatalf("big output step: %v, stdout %d+%d bytes, truncated %v", d, len(st.Stdout.Head), len(st.Stdout.Tail), st.Stdout.Truncated)
	}
	if st, _ := exited("echo on-a-tty"); !strings.Contains(string(st.Events[0].Data), `"pty":true`) || !strings.Contains(st.Stdout.Head, "on-a-tty") {
		t.Fatalf("PTY step: %s %+v", st.Events[0].Data, st.Stdout)
	}
	if st, d := exited("printf abc"); d["exit_code"] != 0.0 || st.Stdout == nil || st.Stdout.Head != "abc" {
		t.Fatalf("HTTP step: %+v %v", st, d)
	}

	for _, e := range list.Items {
		if e.Kind == protocol.KindFile && e.Type != protocol.EventFileChanged && !strings.Contains(string(e.Data), `"path":"/tmp/up.txt","bytes":8`) {
			t.Fatalf("file event %s: %s", e.Type, e.Data)
		}
	}

	// Nothing anywhere in the record holds the secret or the API key.
	all, _ := json.Marshal(list)
	for _, s := range steps {
		st, err := c.AuditStep(ctx, sb.Name, s)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(st)
		all = append(all, b...)
	}
	if bytes.Contains(all, []byte(secret)) || bytes.Contains(all, []byte(testKey)) {
		t.Fatalf("the record holds a secret value or the API key:\n%s", all)
	}
	if st, _ := exited(envCmd); !strings.Contains(string(st.Events[0].Data), `"SECRET_TOKEN"]`) {
		t.Fatalf("the env command's record lacks its env names: %s", st.Events[0].Data)
	}

	// follow=true delivers a new command's events as they happen.
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	defer fcancel()
	live := make(chan protocol.AuditEvent, 16)
	go c.FollowAudit(fctx, sb.Name, cubicle.AuditOptions{SinceSeq: list.NextSeq, Kinds: []string{protocol.KindCommand}}, func(e protocol.AuditEvent) error {
		live <- e
		return nil
	})
	time.Sleep(200 * time.Millisecond) // let the follow attach (it catches up either way)
	mustRun(t, c, sb.Name, "echo live")
	for _, typ := range cmd {
		select {
		case e := <-live:
			if e.Type != typ || e.Seq <= list.NextSeq {
				t.Fatalf("followed %+v, want %s", e, typ)
			}
		case <-fctx.Done():
			t.Fatalf("no live %s event", typ)
		}
	}

	// The record outlives the sandbox: its workspace's admin reads it by id.
	if err := c.DeleteSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	gone, err := c.AuditByID(ctx, sb.ID, cubicle.AuditOptions{SinceSeq: list.NextSeq})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(gone.Items); n == 0 || gone.Items[n-1].Type != protocol.EventDeleted {
		t.Fatalf("record of the deleted sandbox: %+v", gone.Items)
	}
}
