package build

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// MaxLogBytes bounds what a build log keeps; output past it is counted,
// not kept.
const MaxLogBytes = 4 << 20

// Log is one build's step log: written by the build, read (and followed
// while the build runs) by any number of readers.
type Log struct {
	mu      sync.Mutex
	buf     []byte
	dropped int64
	closed  bool
	more    chan struct{} // closed and replaced on every write and at Close
}

// NewLog returns an empty, open log.
func NewLog() *Log { return &Log{more: make(chan struct{})} }

// Write appends p (up to MaxLogBytes in all).
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	room := MaxLogBytes - len(l.buf)
	if room < len(p) {
		l.dropped += int64(len(p) - max(room, 0))
		p = p[:max(room, 0)]
	}
	l.buf = append(l.buf, p...)
	l.wake()
	return len(p), nil
}

// Close ends the log: followers return once they have read it all.
func (l *Log) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped > 0 {
		l.buf = fmt.Appendf(l.buf, "[%d bytes of output not kept]\n", l.dropped)
	}
	l.closed = true
	l.wake()
}

func (l *Log) wake() {
	close(l.more)
	l.more = make(chan struct{})
}

// Follow copies the log to w from the start, and what is written after,
// until the log is closed (nil) or ctx ends (its error). flush, if not
// nil, runs after each copy.
func (l *Log) Follow(ctx context.Context, w io.Writer, flush func()) error {
	off := 0
	for {
		l.mu.Lock()
		chunk, closed, more := l.buf[off:], l.closed, l.more
		l.mu.Unlock()
		if len(chunk) > 0 {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
			off += len(chunk)
			if flush != nil {
				flush()
			}
			continue
		}
		if closed {
			return nil
		}
		select {
		case <-more:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
