package agent

import (
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestActivityChangedMsAgo: the agent says how long ago a command last
// started, wrote or finished, also once the command's session expired, and
// says nothing before any command ran.
func TestActivityChangedMsAgo(t *testing.T) {
	c, _, _ := startAgent(t)
	a, err := c.Activity(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if a.ChangedMsAgo != nil || a.Sessions != 0 {
		t.Fatalf("before any command: %+v", a)
	}

	// Output 300 ms before the command ends: the end is the last change.
	f := protocol.ExecFrame{Type: protocol.FrameExecute, Command: "echo hi; sleep 0.3", TTLSeconds: i64(1)}
	if _, _, code, err := run(t, c, f); err != nil || code != 0 {
		t.Fatalf("command: %d %v", code, err)
	}
	time.Sleep(200 * time.Millisecond)
	if a, err = c.Activity(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if a.Sessions != 1 || a.Running != 0 || a.ChangedMsAgo == nil || *a.ChangedMsAgo < 150 || *a.ChangedMsAgo > 1000 {
		t.Fatalf("200 ms after the end: %+v (changed %v ms ago)", a, deref(a.ChangedMsAgo))
	}

	// Past the session's ttl it is forgotten, its last change is not.
	time.Sleep(1500 * time.Millisecond)
	if a, err = c.Activity(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if a.Sessions != 0 || a.ChangedMsAgo == nil || *a.ChangedMsAgo < 1500 || *a.ChangedMsAgo > 3000 {
		t.Fatalf("after expiry: %+v (changed %v ms ago)", a, deref(a.ChangedMsAgo))
	}
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}
