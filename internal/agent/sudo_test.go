package agent

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sudoRoot is a sandbox root whose /etc/group puts "user" in group sudo
// and leaves "guest" out.
func sudoRoot(t *testing.T) string {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nguest:x:1001:1001::/home/guest:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nsudo:x:27:user\nuser:x:1000:\nguest:x:1001:\n"), 0o644)
	return root
}

// TestSudoPolicy: root and members of group sudo may use the broker;
// anyone else is refused, named.
func TestSudoPolicy(t *testing.T) {
	s := &Server{root: sudoRoot(t)}
	for _, uid := range []uint32{0, 1000} {
		if _, err := s.sudoAllowed(uid); err != nil {
			t.Errorf("uid %d: %v, want allowed", uid, err)
		}
	}
	for uid, name := range map[uint32]string{1001: "guest", 4242: "uid 4242"} {
		if _, err := s.sudoAllowed(uid); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("uid %d: %v, want refused naming %s", uid, err, name)
		}
	}
}

// TestSudoArgs: sudo's common options map onto the request; an unknown
// one is refused rather than ignored.
func TestSudoArgs(t *testing.T) {
	for _, c := range []struct {
		args []string
		argv []string
		user string
		env  bool
	}{
		{[]string{"-n", "true"}, []string{"true"}, "", false},
		{[]string{"-nE", "--", "ls", "-l"}, []string{"ls", "-l"}, "", true},
		{[]string{"-u", "user", "id"}, []string{"id"}, "user", false},
		{[]string{"-uuser", "id"}, []string{"id"}, "user", false},
		{[]string{"-s", "echo", "it's"}, []string{"/bin/bash", "-c", `'echo' 'it'\''s'`}, "", false},
		{[]string{"-i"}, []string{"/bin/bash", "-l"}, "", false},
	} {
		req, err := parseSudoArgs(c.args)
		if err != nil || !slices.Equal(req.Argv, c.argv) || req.User != c.user || req.PreserveEnv != c.env {
			t.Errorf("sudo %q = %+v, %v; want argv %q user %q env %v", c.args, req, err, c.argv, c.user, c.env)
		}
	}
	for _, bad := range [][]string{{"-x", "true"}, {"-u"}, {"-n"}} {
		if _, err := parseSudoArgs(bad); err == nil {
			t.Errorf("sudo %q parsed", bad)
		}
	}
}

// TestSudoBroker: a command sent to the broker runs as root with the
// caller's stdio, a reset environment that names the caller, and its exit
// code comes back; sudo -v answers without running anything.
func TestSudoBroker(t *testing.T) {
	sock := startSudoBroker(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	req := sudoRequest{Argv: []string{"/bin/sh", "-c", `echo "$(id -u) $SUDO_USER $PATH $SECRET"; exit 7`},
		Env: []string{"SECRET=leak", "PATH=/evil", "TERM=xterm"}, Dir: "/"}
	code, err := sudoCall(sock, req, [3]*os.File{devnull, w, w})
	w.Close()
	out, _ := io.ReadAll(r)
	if err != nil || code != 7 {
		t.Fatalf("brokered command: code %d, %v", code, err)
	}
	if got := strings.TrimSpace(string(out)); got != "0 root "+securePath {
		t.Fatalf("brokered command printed %q; want uid 0, the caller and the secure PATH, no caller variables", got)
	}
	if code, err := sudoCall(sock, sudoRequest{ValidateOnly: true}, [3]*os.File{devnull, devnull, devnull}); err != nil || code != 0 {
		t.Fatalf("sudo -v: %d, %v", code, err)
	}
	if code, err := sudoCall(sock, sudoRequest{Argv: []string{"no-such-command-here"}}, [3]*os.File{devnull, devnull, devnull}); err == nil || code == 0 {
		t.Fatalf("a missing command: %d, %v", code, err)
	}
}

// startSudoBroker serves a broker on a temporary socket for the test.
func startSudoBroker(t *testing.T) string {
	s, err := NewServer("tok")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "run", "sudo.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeSudo(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil || time.Now().After(deadline) {
			return sock
		}
	}
}

// TestSudoSignalsAndHangup: a signal byte from the client reaches the
// command (its exit code says so), and a client that goes away takes its
// command with it.
func TestSudoSignalsAndHangup(t *testing.T) {
	sock := startSudoBroker(t)
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	pidFile := filepath.Join(t.TempDir(), "pid")
	send := func(command string) *net.UnixConn {
		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(sudoRequest{Argv: []string{"/bin/sh", "-c", command}, Dir: "/"})
		fd := int(devnull.Fd())
		if _, _, err := conn.WriteMsgUnix(body, unix.UnixRights(fd, fd, fd), nil); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	waitPid := func() int {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if b, err := os.ReadFile(pidFile); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return pid
			}
		}
		t.Fatal("the brokered command did not start")
		return 0
	}

	conn := send("echo $$ >" + pidFile + "; exec sleep 30")
	waitPid()
	conn.Write([]byte{byte(syscall.SIGTERM)})
	var rep sudoReply
	if err := json.NewDecoder(conn).Decode(&rep); err != nil || rep.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("after SIGTERM: %+v, %v; want exit code %d", rep, err, 128+int(syscall.SIGTERM))
	}
	conn.Close()

	os.Remove(pidFile)
	conn = send("echo $$ >" + pidFile + "; exec sleep 30")
	pid := waitPid()
	conn.Close()
	for deadline := time.Now().Add(5 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the command of a client that went away (pid %d) still runs", pid)
		}
	}
}
