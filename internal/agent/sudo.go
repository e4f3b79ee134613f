package agent

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// sudo, brokered by PID 1. A setuid sudo cannot raise privileges in a
// sandbox: gVisor does not honour setuid bits (google/gvisor#5299) and the
// namespace runtime sets no_new_privs. So the default computer's
// /usr/bin/sudo is the cubicle binary (SudoMain), which asks the agent,
// over SudoSocket, to run the command as root (or -u USER). The agent
// decides by the caller's kernel-reported uid (SO_PEERCRED): root, or a
// user the sandbox's /etc/group puts in group "sudo", is allowed, with no
// password, as the default computer's sudoers grants "user". What this
// opens is no more than NOPASSWD sudo would: root inside the sandbox,
// which the sandbox's isolation bounds.

// SudoSocket is the broker's socket inside the sandbox.
const SudoSocket = "/run/cubicle/sudo.sock"

// sudoGroup is the group whose members may use the broker.
const sudoGroup = "sudo"

// securePath is the PATH a brokered command gets (sudo's secure_path).
const securePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sudoRequest is what SudoMain sends, once, with its stdin, stdout and
// stderr as SCM_RIGHTS; afterwards each byte it sends is a signal to
// forward. The answer is one sudoReply line.
type sudoRequest struct {
	Argv []string `json:"argv"`
	// User is the target user ("" is root).
	User string `json:"user,omitempty"`
	// Env is the caller's environment; only TERM and the locale pass
	// unless PreserveEnv.
	Env         []string `json:"env"`
	PreserveEnv bool     `json:"preserve_env,omitempty"`
	Dir         string   `json:"dir"`
	// ValidateOnly asks whether the caller may use sudo (sudo -v).
	ValidateOnly bool `json:"validate_only,omitempty"`
}

type sudoReply struct {
	ExitCode int    `json:"exit_code"`
	Error    string `json:"error,omitempty"`
}

// ServeSudo brokers sudo on the unix socket at path until ctx ends.
func (s *Server) ServeSudo(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("sudo broker: %w", err)
	}
	os.Remove(path) // a socket left by an earlier agent
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("sudo broker: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil { // the policy is the peer check, not the mode
		ln.Close()
		return fmt.Errorf("sudo broker: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sudo broker: %w", err)
		}
		go s.serveSudoConn(conn)
	}
}

func (s *Server) serveSudoConn(conn *net.UnixConn) {
	defer conn.Close()
	reply := func(r sudoReply) { json.NewEncoder(conn).Encode(r) }
	req, files, err := readSudoRequest(conn)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		reply(sudoReply{ExitCode: 1, Error: err.Error()})
		return
	}
	uid, err := peerUID(conn)
	if err != nil {
		reply(sudoReply{ExitCode: 1, Error: err.Error()})
		return
	}
	caller, err := s.sudoAllowed(uid)
	if err != nil {
		reply(sudoReply{ExitCode: 1, Error: err.Error()})
		return
	}
	if req.ValidateOnly {
		reply(sudoReply{})
		return
	}
	code, err := s.runSudo(conn, req, caller, files)
	if err != nil {
		reply(sudoReply{ExitCode: 1, Error: err.Error()})
		return
	}
	reply(sudoReply{ExitCode: code})
}

// readSudoRequest reads the request message and the three descriptors
// sent with it.
func readSudoRequest(conn *net.UnixConn) (sudoRequest, []*os.File, error) {
	var req sudoRequest
	buf := make([]byte, 256<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return req, nil, fmt.Errorf("read sudo request: %w", err)
	}
	var files []*os.File
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil {
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), "sudo-stdio"))
			}
		}
	}
	if len(files) != 3 {
		return req, files, fmt.Errorf("sudo request carried %d descriptors, want stdin, stdout and stderr", len(files))
	}
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		return req, files, fmt.Errorf("decode sudo request: %w", err)
	}
	if len(req.Argv) == 0 && !req.ValidateOnly {
		return req, files, errors.New("sudo request names no command")
	}
	return req, files, nil
}

// peerUID is the uid the kernel reports for conn's other end.
func peerUID(conn *net.UnixConn) (uint32, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("sudo caller's credentials: %w", cerr)
	}
	return cred.Uid, nil
}

// sudoAllowed returns the caller with uid if it may use the broker: root,
// or a member of group sudo in the sandbox's /etc/group.
func (s *Server) sudoAllowed(uid uint32) (identity, error) {
	caller, err := lookupIdentity(s.root, strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return identity{}, err
	}
	if uid == 0 {
		return caller, nil
	}
	groups, err := readGroups(filepath.Join(s.root, "etc/group"))
	if err != nil {
		return identity{}, err
	}
	if g, ok := findGroup(groups, sudoGroup); ok && slices.Contains(caller.groups, g.gid) {
		return caller, nil
	}
	name := caller.name
	if name == "" {
		name = "uid " + strconv.FormatUint(uint64(uid), 10)
	}
	return identity{}, fmt.Errorf("%s is not in the sudoers file (group %q)", name, sudoGroup)
}

// runSudo runs req as its target user with files as stdio, forwarding the
// signals the client sends, and returns its exit code (128+signal when
// killed). A client that goes away takes the command with it.
func (s *Server) runSudo(conn *net.UnixConn, req sudoRequest, caller identity, files []*os.File) (int, error) {
	target, err := lookupIdentity(s.root, cmp.Or(req.User, "root"))
	if err != nil {
		return 0, err
	}
	env := sudoEnv(req, caller, target)
	if req.Dir == "" {
		req.Dir = target.home
	}
	path, err := lookPath(s.root, req.Argv[0])
	if err != nil {
		return 0, err
	}
	attr := &syscall.ProcAttr{Dir: req.Dir, Env: env, Files: []uintptr{files[0].Fd(), files[1].Fd(), files[2].Fd()},
		Sys: &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: target.uid, Gid: target.gid, Groups: target.groups}}}
	pid, exited, err := s.reaper.start(func() (int, error) { return syscall.ForkExec(path, req.Argv, attr) })
	if err != nil {
		return 0, fmt.Errorf("sudo: %s: %w", req.Argv[0], err)
	}
	var over atomic.Bool // the group's id may be reused once it exits
	go func() {
		r := bufio.NewReader(conn)
		for {
			b, err := r.ReadByte()
			if over.Load() {
				return
			}
			if err != nil { // the client went away
				syscall.Kill(-pid, syscall.SIGKILL)
				return
			}
			syscall.Kill(-pid, syscall.Signal(b))
		}
	}()
	ws := <-exited
	over.Store(true)
	if ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ws.ExitStatus(), nil
}

// sudoEnv is a brokered command's environment, as sudo's env_reset makes
// it: a secure PATH, the target's HOME, USER and LOGNAME, the caller's
// TERM and locale, SUDO_*; with PreserveEnv the caller's whole
// environment under those.
func sudoEnv(req sudoRequest, caller, target identity) []string {
	var env []string
	for _, kv := range req.Env {
		k, _, _ := strings.Cut(kv, "=")
		if req.PreserveEnv || k == "TERM" || k == "LANG" || strings.HasPrefix(k, "LC_") {
			env = append(env, kv)
		}
	}
	name := cmp.Or(target.name, "root")
	set := map[string]string{
		"HOME": target.home, "USER": name, "LOGNAME": name, "SHELL": "/bin/bash",
		"SUDO_USER": caller.name, "SUDO_UID": strconv.FormatUint(uint64(caller.uid), 10),
		"SUDO_GID": strconv.FormatUint(uint64(caller.gid), 10), "SUDO_COMMAND": strings.Join(req.Argv, " "),
	}
	if !req.PreserveEnv {
		set["PATH"] = securePath
	}
	env = slices.DeleteFunc(env, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, over := set[k]
		return over
	})
	for _, k := range slices.Sorted(maps.Keys(set)) {
		env = append(env, k+"="+set[k])
	}
	return env
}

// lookPath finds command in the secure PATH under root (a name with a
// slash is taken as is).
func lookPath(root, command string) (string, error) {
	if strings.Contains(command, "/") {
		return command, nil
	}
	for _, dir := range filepath.SplitList(securePath) {
		p := filepath.Join(dir, command)
		if st, err := os.Stat(filepath.Join(root, p)); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("sudo: %s: command not found", command)
}
