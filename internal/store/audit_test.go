package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestAuditQueries checks the record's filters (since, kinds, step,
// limit), that a duplicate seq is ignored, and that records outlive their
// sandbox (no foreign key to it).
func TestAuditQueries(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC()
	ev := func(seq int64, kind, typ string, step int64) protocol.AuditEvent {
		return protocol.AuditEvent{SandboxID: "gone-sandbox", Seq: seq, Time: now, WorkspaceID: "w", Actor: protocol.Actor{User: "u", KeyPrefix: "k"},
			Kind: kind, Type: typ, Step: step, Data: []byte(`{"a":1}`)}
	}
	evs := []protocol.AuditEvent{ev(1, protocol.KindLifecycle, protocol.EventCreated, 0), ev(2, protocol.KindCommand, protocol.EventCommandStarted, 2),
		ev(3, protocol.KindCommand, protocol.EventCommandExited, 2), ev(4, protocol.KindLifecycle, protocol.EventStopped, 0)}
	if err := st.AppendAuditEvents(ctx, evs, []AuditOutput{{SandboxID: "gone-sandbox", Step: 2, Stream: "stdout", Head: []byte("hi"), TotalBytes: 2, Time: now}}); err != nil {
		t.Fatal(err)
	}
	if err := st.AppendAuditEvents(ctx, []protocol.AuditEvent{ev(1, protocol.KindLifecycle, "dup", 0)}, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    AuditQuery
		seqs []int64
	}{
		{AuditQuery{}, []int64{1, 2, 3, 4}},
		{AuditQuery{SinceSeq: 2}, []int64{3, 4}},
		{AuditQuery{Kinds: []string{protocol.KindCommand}}, []int64{2, 3}},
		{AuditQuery{Step: 2, Limit: 1}, []int64{2}},
	} {
		c.q.SandboxID = "gone-sandbox"
		got, err := st.AuditEvents(ctx, c.q)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		for _, e := range got {
			seqs = append(seqs, e.Seq)
		}
		if len(seqs) != len(c.seqs) || (len(seqs) > 0 && seqs[0] != c.seqs[0]) || seqs[len(seqs)-1] != c.seqs[len(c.seqs)-1] {
			t.Fatalf("%+v: seqs %v, want %v", c.q, seqs, c.seqs)
		}
		if got[0].Actor.KeyPrefix != "k" || string(got[0].Data) != `{"a":1}` || got[0].Type == "dup" {
			t.Fatalf("event read back: %+v", got[0])
		}
	}
	if seq, ws, err := st.MaxAuditSeq(ctx, "gone-sandbox"); seq != 4 || ws != "w" || err != nil {
		t.Fatalf("max seq = %d %q %v", seq, ws, err)
	}
	if outs, err := st.AuditOutputs(ctx, "gone-sandbox", 2); err != nil || len(outs) != 1 || string(outs[0].Head) != "hi" {
		t.Fatalf("outputs = %+v, %v", outs, err)
	}
}
