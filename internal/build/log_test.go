package build

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestLogFollow checks a follower sees what is written before and after
// it starts and returns at Close, and that output past MaxLogBytes is
// counted, not kept.
func TestLogFollow(t *testing.T) {
	l := NewLog()
	l.Write([]byte("one\n"))
	var got bytes.Buffer
	done := make(chan error)
	go func() { done <- l.Follow(context.Background(), &got, nil) }()
	time.Sleep(10 * time.Millisecond)
	l.Write([]byte("two\n"))
	l.Close()
	if err := <-done; err != nil || got.String() != "one\ntwo\n" {
		t.Fatalf("follow: %q %v", got.String(), err)
	}

	big := NewLog()
	big.Write(bytes.Repeat([]byte("x"), MaxLogBytes))
	big.Write([]byte("dropped"))
	big.Close()
	var all strings.Builder
	big.Follow(context.Background(), &all, nil)
	if !strings.HasSuffix(all.String(), "[7 bytes of output not kept]\n") || len(all.String()) > MaxLogBytes+64 {
		t.Fatalf("capped log ends %q", all.String()[len(all.String())-40:])
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := NewLog().Follow(ctx, &all, nil); err == nil {
		t.Fatal("a follower of an open log ignored its context")
	}
}
