package agent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/vport"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// stopGrace is how long PID 1 waits for processes to exit after forwarding
// SIGTERM.
const stopGrace = 5 * time.Second

// defaultBufMax bounds each output stream's replay window per session.
const defaultBufMax = 16 << 20

// Server is the agent's HTTP API: health, exec WebSocket, files and search.
// Every request must carry its current token: the one it was created with
// until POST /v1/token replaces it. A Server owns the sessions of the
// commands it starts; Close kills them.
type Server struct {
	token    atomic.Pointer[[]byte]
	log      *slog.Logger
	reaper   *reaper
	sessions *sessionTable
	baseEnv  []string
	root     string
	mux      *http.ServeMux
	memLimit int64
	guard    *memGuard
	// closeGuard releases the guard's meter.
	closeGuard func()
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithBaseEnv sets the environment every command starts from (default: the
// agent's own environment).
func WithBaseEnv(env []string) Option { return func(s *Server) { s.baseEnv = env } }

// WithReapAll makes the Server collect the exit status of every child of the
// process, not just the commands it started. Set it when the agent is PID 1
// (or a child subreaper) and call Reap; without it, orphans stay zombies.
func WithReapAll() Option { return func(s *Server) { s.reaper = newReaper(true) } }

// WithOutputBuffer sets how many bytes of each output stream a session keeps
// for replay (default 16 MiB).
func WithOutputBuffer(n int) Option { return func(s *Server) { s.sessions = newSessionTable(n) } }

// WithMemLimit turns on the OOM guard for a sandbox limited to limit bytes
// (see memGuard); call GuardMemory to run it. It stays off, and says why in
// GET /v1/memguard, when /proc/meminfo does not describe the sandbox.
func WithMemLimit(limit int64) Option { return func(s *Server) { s.memLimit = limit } }

// NewServer returns a Server accepting only requests bearing token.
func NewServer(token string, opts ...Option) (*Server, error) {
	if token == "" {
		return nil, errors.New("agent: empty token")
	}
	s := &Server{
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		reaper:   newReaper(false),
		sessions: newSessionTable(defaultBufMax),
		baseEnv:  os.Environ(),
		root:     "/",
	}
	tok := []byte(token)
	s.token.Store(&tok)
	for _, o := range opts {
		o(s)
	}
	s.guard, s.closeGuard = newMemGuard(s.memLimit, s.log)
	s.guard.onKill = s.noteOOMKill
	s.reaper.onFork = s.guard.wake
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /v1/health", s.handleHealth)
	s.mux.HandleFunc("POST /v1/token", s.handleRotateToken)
	s.mux.HandleFunc("POST /v1/identity", s.handleIdentity)
	s.mux.HandleFunc("GET /v1/memguard", s.handleMemGuard)
	s.mux.HandleFunc("GET /v1/activity", s.handleActivity)
	s.mux.HandleFunc("GET /v1/exec", s.handleExec)
	s.mux.HandleFunc("GET /v1/files", s.handleReadFile) // also serves HEAD
	s.mux.HandleFunc("PUT /v1/files", s.handleWriteFile)
	s.mux.HandleFunc("GET /v1/stat", s.handleStat)
	s.mux.HandleFunc("POST /v1/glob", s.handleGlob)
	s.mux.HandleFunc("POST /v1/grep", s.handleGrep)
	return s, nil
}

// ServeHTTP authenticates the request and routes it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	got, ok := strings.CutPrefix(r.Header.Get(TokenHeader), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), *s.token.Load()) != 1 {
		writeError(w, http.StatusUnauthorized, "Unauthorized", "missing or invalid agent token")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Reap collects child exit statuses until ctx ends; only meaningful with
// WithReapAll.
func (s *Server) Reap(ctx context.Context) { s.reaper.run(ctx) }

// GuardMemory runs the OOM guard until ctx ends; a no-op unless
// WithMemLimit enabled it.
func (s *Server) GuardMemory(ctx context.Context) { s.guard.run(ctx) }

// Close kills every running command and releases the guard.
func (s *Server) Close() {
	s.sessions.killAll()
	s.closeGuard()
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, healthAnswer{OK: true, Protocol: ProtocolVersion})
}

// Run is `cubicle agent`: it serves on addr until ctx ends or SIGTERM/SIGINT
// arrives. As PID 1 it also reaps every zombie, makes sure /tmp exists,
// brokers sudo (ServeSudo), and on SIGTERM forwards the signal to every
// process before exiting.
func Run(ctx context.Context, addr, token string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// Listening comes first: from here the daemon's connection waits in
	// the backlog and is answered the moment Serve starts, instead of
	// being refused and retried. The threads are reserved meanwhile;
	// commands fork only once they are (reaper.threads).
	if err := keepOwnCaps(os.Getenv(OwnCapsEnv)); err != nil {
		return err
	}
	ln, err := listen(addr, log)
	if err != nil {
		return err
	}
	threads := make(chan struct{})
	go func() { reserveThreads(reservedThreads); close(threads) }()
	pid1 := os.Getpid() == 1
	env := withoutVar(withoutVar(withoutVar(os.Environ(), MemLimitEnv), OwnCapsEnv), vport.FDEnv)
	opts := []Option{WithLogger(log), WithBaseEnv(env), WithMemLimit(parseMemLimit(os.Getenv(MemLimitEnv)))}
	if pid1 {
		opts = append(opts, WithReapAll())
		if err := ensureTmp(); err != nil {
			log.Warn("create /tmp", "err", err)
		}
	}
	srv, err := NewServer(token, opts...)
	if err != nil {
		ln.Close()
		return err
	}
	srv.reaper.threads = threads
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go srv.Reap(ctx)
	go srv.GuardMemory(ctx)
	if pid1 {
		go func() {
			if err := srv.ServeSudo(ctx, SudoSocket); err != nil {
				log.Warn("sudo broker stopped", "err", err)
			}
		}()
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("agent listening", "addr", ln.Addr().String(), "pid1", pid1)
	select {
	case err := <-errc:
		return fmt.Errorf("agent: serve: %w", err)
	case <-ctx.Done():
	}
	if pid1 {
		// Forward the stop to every other process in the sandbox and give
		// them a grace period; the kernel kills the rest when PID 1 exits.
		syscall.Kill(-1, syscall.SIGTERM)
		waitForChildren(stopGrace)
	}
	srv.Close()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	return nil
}

// listen returns the agent's listener: the virtio-serial port named by
// vport.FDEnv (a microVM's), else a TCP listener on addr.
func listen(addr string, log *slog.Logger) (net.Listener, error) {
	v := os.Getenv(vport.FDEnv)
	if v == "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("agent: listen %s: %w", addr, err)
		}
		return ln, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("agent: %s=%q is no inherited file descriptor", vport.FDEnv, v)
	}
	// No command may inherit the port.
	syscall.CloseOnExec(fd)
	return vport.Listen(os.NewFile(uintptr(fd), "agent-port"), log), nil
}

// ensureTmp creates a world-writable sticky /tmp if the image lacks one.
func ensureTmp() error {
	if _, err := os.Stat("/tmp"); err == nil {
		return nil
	}
	if err := os.Mkdir("/tmp", 0o700); err != nil {
		return err
	}
	return os.Chmod("/tmp", 0o777|os.ModeSticky) // not subject to the umask
}

// waitForChildren reaps children until none is left or d has passed.
func waitForChildren(d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.ECHILD) {
			return
		}
		if pid <= 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func withoutVar(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// writeError answers in the protocol's {"detail":{"error","message"}} shape,
// so the daemon can relay agent errors to clients unchanged.
func writeError(w http.ResponseWriter, status int, kind, msg string) {
	writeJSON(w, status, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: kind, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
