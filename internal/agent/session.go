package agent

import (
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Output streams of a session, indexing session.out.
const (
	streamStdout = 0
	streamStderr = 1
)

// drainGrace is how long a finished command's output pipes may stay open (a
// background child inheriting them) before the agent stops reading and
// reports the exit.
const drainGrace = 100 * time.Millisecond

// groupKillWait bounds how long killGroup keeps killing a group whose
// members do not go away (zombies still accept signals until reaped).
const groupKillWait = 5 * time.Second

// session is one command and everything needed to (re)attach to it: its
// output windows, exit status and lifetime timers. Invariants: done moves
// false → true once, after which out never changes; every change to out or
// done closes and replaces changed, waking every attached streamer.
type session struct {
	id               string
	proc             *proc
	killOnDisconnect bool
	binary           bool          // started by a binary-safe client: output is bytes, not text
	limit            time.Duration // run-time limit (timeout_seconds); <= 0: none
	idle             time.Duration // < 0: never kill for lack of clients
	ttl              time.Duration // < 0: keep the finished session forever

	// ready is closed once the command has been started (or failed to);
	// startErr is valid after that.
	ready    chan struct{}
	startErr error

	input chan []byte // stdin writer queue; a nil slice means close stdin
	stop  chan struct{}

	mu       sync.Mutex
	out      [2]outBuf
	changed  chan struct{}
	changeAt time.Time // when changed was last closed (or the session made)
	done     bool
	exitCode int
	timedOut bool
	clients  int
	timers   []*time.Timer // timeout timer, stopped on finish
	idleT    *time.Timer   // armed while no client is attached

	// readers holds the next offsets of every attached streamer. While
	// any is attached, the pumps apply backpressure instead of letting
	// the window drop bytes a live client has not received: a slow client
	// slows the command (as a terminal would), it never silently loses
	// output. With no client attached the window drops its oldest bytes,
	// and a reconnect resumes from the earliest byte still held.
	readers map[*[2]int64]struct{}
	space   *sync.Cond // signalled when a reader advances or leaves
	waiting int        // pumps blocked on backpressure
}

func newSession(id string, bufMax int) *session {
	s := &session{id: id, ready: make(chan struct{}), changed: make(chan struct{}), stop: make(chan struct{}),
		readers: map[*[2]int64]struct{}{}, changeAt: time.Now()}
	s.space = sync.NewCond(&s.mu)
	s.out[streamStdout].max = bufMax
	s.out[streamStderr].max = bufMax
	return s
}

// run supervises a started command: pumps its output, applies the timeout,
// and records the exit. onFinish runs once the session is done.
func (s *session) run(p *proc, onFinish func(*session)) {
	s.proc = p
	var pumps sync.WaitGroup
	for i, f := range p.out {
		if f != nil {
			pumps.Add(1)
			go func() { defer pumps.Done(); s.pump(i, f) }()
		}
	}
	if p.stdin != nil && p.pty == nil {
		s.input = make(chan []byte, 64)
		go s.writeStdin(p.stdin)
	}
	s.mu.Lock()
	if s.limit > 0 {
		s.timers = append(s.timers, time.AfterFunc(s.limit, s.timeout))
	}
	s.mu.Unlock()
	close(s.ready)

	ws := <-p.exited
	if ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		killGroup(p.pid)
	}
	pumped := make(chan struct{})
	go func() { pumps.Wait(); close(pumped) }()
	s.drain(p, pumped)
	p.closeAll()
	close(s.stop)

	s.mu.Lock()
	for _, t := range s.timers {
		t.Stop()
	}
	if s.idleT != nil {
		s.idleT.Stop()
	}
	s.done, s.exitCode = true, exitCode(ws)
	s.broadcastLocked()
	s.mu.Unlock()
	onFinish(s)
}

// killGroup SIGKILLs process group pgid until no process is left in it.
// A command whose leader was SIGKILLed (its own `kill -9 0`, the timeout,
// a kill frame, the OOM guard) takes its whole group with it. One kill is
// not enough under gVisor: it signals the members of a snapshot of the
// group, so a child forked while the signal goes round is not in it and
// survives (Linux rules that out under tasklist_lock), and a fork bomb
// killed that way keeps running and holds the sandbox's task bound. Each
// round kills the parents of the next round's stragglers, so it ends once
// the agent (PID 1, to which the orphans fall) has reaped them.
func killGroup(pgid int) {
	for deadline := time.Now().Add(groupKillWait); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err := syscall.Kill(-pgid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
			return
		}
	}
}

// drain waits for the pumps after the command exited. Pipes still open
// after drainGrace are held by a background child: the pumps are told to
// take what the pipes hold and stop, so the exit is reported — unless a
// pump is waiting for a slow client to take output, which is progress, not
// a stuck pipe. Output the command wrote before it exited is never lost,
// however late its pump gets to run (closing the pipe instead dropped it
// when the pump had not read it within the grace on a loaded host).
func (s *session) drain(p *proc, pumped <-chan struct{}) {
	for {
		select {
		case <-pumped:
			return
		case <-time.After(drainGrace):
		}
		s.mu.Lock()
		blocked := s.waiting > 0
		s.mu.Unlock()
		if blocked {
			continue
		}
		for _, f := range p.out {
			if f != nil {
				if f.SetReadDeadline(time.Now()) != nil { // see pump
					f.Close() // not pollable: unblock the pump the hard way
				}
			}
		}
		<-pumped
		return
	}
}

// waitForRoomLocked blocks (releasing s.mu) while writing n more bytes to
// stream i would push out of the window bytes an attached reader has not
// taken yet.
func (s *session) waitForRoomLocked(i, n int) {
	for len(s.readers) > 0 {
		slowest := s.out[i].end()
		for r := range s.readers {
			slowest = min(slowest, max(r[i], s.out[i].base))
		}
		if s.out[i].end()+int64(n)-slowest <= int64(s.out[i].max) {
			return
		}
		s.waiting++
		s.space.Wait()
		s.waiting--
	}
}

// pump copies one output stream into its window. A text session's pump
// never splits a UTF-8 sequence: an incomplete trailing sequence waits for
// its remaining bytes (or EOF). A binary session's takes every byte as it
// comes, so output that is not text is never held back.
//
// Once drain sets a read deadline, the pump reads only what the pipe
// already holds and then stops, as at EOF.
func (s *session) pump(i int, f *os.File) {
	buf := make([]byte, 32<<10)
	held, rest := 0, false
	for {
		var n int
		var err error
		if rest {
			n, err = readBuffered(f, buf[held:])
		} else if n, err = f.Read(buf[held:]); errors.Is(err, os.ErrDeadlineExceeded) {
			rest, err = true, f.SetReadDeadline(time.Time{})
			if err == nil {
				continue
			}
		}
		n += held
		cut := n
		if !s.binary {
			cut = completePrefix(buf[:n])
		}
		if err != nil {
			cut = n // EOF or error: flush whatever is held
		}
		if cut > 0 {
			s.mu.Lock()
			s.waitForRoomLocked(i, cut)
			s.out[i].write(buf[:cut])
			s.broadcastLocked()
			s.mu.Unlock()
		}
		held = copy(buf, buf[cut:n])
		if err != nil {
			return
		}
	}
}

// readBuffered reads from pollable f what it holds now, without waiting:
// io.EOF when it holds nothing.
func readBuffered(f *os.File, p []byte) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, rerr = unix.Read(int(fd), p)
		return true // never wait for more
	}); err != nil {
		return 0, err
	}
	switch {
	case errors.Is(rerr, unix.EAGAIN) || (rerr == nil && n == 0):
		return 0, io.EOF
	case rerr != nil:
		return 0, rerr
	}
	return n, nil
}

// writeStdin feeds queued input to the command's stdin pipe until stdin is
// closed by the client or the command finishes.
func (s *session) writeStdin(w io.WriteCloser) {
	for {
		select {
		case <-s.stop:
			return
		case data := <-s.input:
			if data == nil {
				w.Close()
				return
			}
			if _, err := w.Write(data); err != nil {
				if errors.Is(err, os.ErrClosed) {
					return
				}
			}
		}
	}
}

// writeInput sends client input to the command's stdin or terminal.
func (s *session) writeInput(data []byte) {
	if len(data) == 0 {
		return
	}
	if s.proc.pty != nil {
		s.proc.pty.Write(data) // best effort: the command may have exited
		return
	}
	if s.input == nil {
		return // stdin is /dev/null
	}
	select {
	case s.input <- data:
	case <-s.stop:
	}
}

// closeStdin half-closes stdin. It is ignored under a PTY, where EOF is ^D.
func (s *session) closeStdin() {
	if s.input == nil {
		return
	}
	select {
	case s.input <- nil:
	case <-s.stop:
	}
}

// resize changes the terminal size; a no-op without a PTY.
func (s *session) resize(rows, cols int) error {
	if s.proc.pty == nil || rows <= 0 || cols <= 0 {
		return nil
	}
	return setWinsize(s.proc.pty, uint16(rows), uint16(cols))
}

// notice appends msg to the command's stderr (its terminal under a PTY)
// unless the session is done, whose output never changes.
func (s *session) notice(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	i := streamStderr
	if s.proc.pty != nil {
		i, msg = streamStdout, strings.ReplaceAll(msg, "\n", "\r\n")
	}
	s.out[i].write([]byte(msg))
	s.broadcastLocked()
}

// kill sends SIGKILL to the command's whole process group.
func (s *session) kill() {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if !done {
		syscall.Kill(-s.proc.pid, syscall.SIGKILL)
	}
}

func (s *session) timeout() {
	s.mu.Lock()
	if !s.done {
		s.timedOut = true
	}
	s.mu.Unlock()
	s.kill()
}

// attach registers a client; it cancels any pending idle kill.
func (s *session) attach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients++
	if s.idleT != nil {
		s.idleT.Stop()
		s.idleT = nil
	}
}

// detach unregisters a client. The last one leaving a running command
// kills it (kill_on_disconnect) or arms the idle timer.
func (s *session) detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients--
	if s.clients > 0 || s.done {
		return
	}
	switch {
	case s.killOnDisconnect:
		go s.kill()
	case s.idle >= 0:
		s.idleT = time.AfterFunc(s.idle, s.kill)
	}
}

func (s *session) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
	s.changeAt = time.Now()
}
