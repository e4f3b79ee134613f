package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// FindRunsc locates the runsc binary: flagValue when set, else a runsc next
// to the running executable (how releases ship it), else runsc on PATH.
func FindRunsc(flagValue string) (string, error) {
	if flagValue != "" {
		if _, err := os.Stat(flagValue); err != nil {
			return "", fmt.Errorf("find runsc: %w", err)
		}
		return flagValue, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "runsc")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath("runsc")
	if err != nil {
		return "", fmt.Errorf("find runsc: not next to the executable and %w", err)
	}
	return p, nil
}

// runscWaitDelay bounds how long a finished runsc command may keep its
// output pipes open through a child. Only the short-lived commands (state,
// kill, delete) use pipes; the sandbox-creating one gets files.
const runscWaitDelay = 5 * time.Second

// Deadlines of runsc invocations, whatever the caller's context: a runsc
// subcommand talks to the sandbox's Sentry, and one that is stopped or
// wedged would otherwise hang the daemon's call (and the sandbox's
// lifecycle lock) for ever. Starting and checkpointing move a whole
// memory image; everything else answers in milliseconds.
const (
	runscTimeout      = 30 * time.Second
	runscStartTimeout = 2 * time.Minute
	runscSaveTimeout  = 10 * time.Minute
)

// deadline is how long the runsc invocation with args may take.
func (d *Driver) deadline(args []string) time.Duration {
	for _, a := range args {
		switch a {
		case "run", "restore":
			return runscStartTimeout
		case "checkpoint":
			return runscSaveTimeout
		}
	}
	return d.runscTimeout
}

// command returns a runsc invocation with the driver's global flags followed
// by args, and the cancel of its deadline, to call once it has finished.
func (d *Driver) command(ctx context.Context, args ...string) (*exec.Cmd, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, d.deadline(args))
	cmd := exec.CommandContext(ctx, d.runsc, append(d.globalFlags(), args...)...)
	cmd.WaitDelay = runscWaitDelay
	return cmd, cancel
}

// globalFlags are runsc's flags common to every subcommand. They must be the
// same for create, state, kill and delete, since runsc keys its state on
// --root and re-derives sandbox behaviour from the others.
func (d *Driver) globalFlags() []string {
	f := []string{
		"--root", d.runscRoot(),
		"--platform=" + d.platform,
		"--network=sandbox",
		"--overlay2=" + d.overlay,
		"--file-access=" + d.fileAccess,
		"--host-uds=none",
	}
	return append(f, d.extraFlags...)
}

// run executes a short-lived runsc subcommand and returns its stdout. The
// error carries runsc's stderr.
func (d *Driver) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd, cancel := d.command(ctx, args...)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &runscError{args: args, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

// runscError is a failed runsc subcommand with what it printed.
type runscError struct {
	args   []string
	err    error
	stderr string
}

func (e *runscError) Error() string {
	return fmt.Sprintf("runsc %s: %v: %s", strings.Join(e.args, " "), e.err, e.stderr)
}

func (e *runscError) Unwrap() error { return e.err }

// isNotExist reports whether err is runsc saying the container is unknown.
func isNotExist(err error) bool {
	var re *runscError
	if !errors.As(err, &re) {
		return false
	}
	return strings.Contains(re.stderr, "does not exist") || strings.Contains(re.stderr, "no such file or directory")
}

// failureReason summarises why `runsc run` failed from the tails of its log
// (JSON lines whose "msg" is extracted) and of the console, where runsc and
// PID 1 write to stderr. Lines already seen are not repeated.
func failureReason(logPath, consolePath string) string {
	var lines []string
	seen := map[string]bool{}
	for _, p := range []string{logPath, consolePath} {
		for _, l := range strings.Split(tailFile(p, 2048), "\n") {
			var entry struct {
				Msg string `json:"msg"`
			}
			if json.Unmarshal([]byte(l), &entry) == nil && entry.Msg != "" {
				l = entry.Msg
			}
			l = strings.TrimSpace(l)
			if l != "" && !seen[l] {
				seen[l] = true
				lines = append(lines, l)
			}
		}
	}
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	if len(lines) == 0 {
		return "no output from runsc"
	}
	return strings.Join(lines, "; ")
}

// tailFile returns up to the last n bytes of path, trimmed, or "" if it
// cannot be read.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	return strings.TrimSpace(string(buf))
}
