package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// execShell runs every CLI command line; it exists in every image, unlike
// bash (the protocol's default).
const execShell = "/bin/sh"

type execFlags struct {
	tty     bool
	stdin   bool
	timeout int64
	workdir string
	env     []string
}

// newExecCmd is `cubicle exec NAME -- CMD...`: run a command in a sandbox,
// streaming its output, and exit with its exit code.
func newExecCmd() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec NAME [flags] -- CMD [ARG...]",
		Short: "Run a command in a sandbox, streaming its output",
		Long: "Run a command in a sandbox with " + execShell + " -c, streaming stdout and stderr live, and exit\n" +
			"with the command's exit code. Several arguments are shell-quoted and joined; a single\n" +
			"argument is passed to the shell as is, so it may hold pipes and redirections.",
		Example: "  cubicle exec box -- ls -la /\n" +
			"  cubicle exec box -- 'ps aux | grep python'\n" +
			"  cubicle exec -it box -- bash",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExec(cmd, args[0], args[1:], f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.tty, "tty", "t", false, "run the command on a pseudo-terminal")
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "forward stdin to the command")
	fl.Int64Var(&f.timeout, "timeout", 0, "seconds the command may run (0: no limit, like a local shell)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "absolute working directory for the command")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "K=V environment variable (repeatable)")
	return cmd
}

// execRequest builds the SDK request from the flags, without any I/O.
func (f execFlags) execRequest(argv []string) (cubicle.ExecRequest, error) {
	req := cubicle.ExecRequest{
		Command: shellJoin(argv),
		Shell:   execShell,
		Timeout: time.Duration(f.timeout) * time.Second,
		PTY:     f.tty,
	}
	if f.timeout == 0 {
		req.Timeout = -1 // no limit: an interactive shell or a long build must not die at 60 s
	}
	if f.workdir != "" || len(f.env) > 0 {
		rc := &protocol.RunConfig{WorkDir: f.workdir}
		for _, kv := range f.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return req, fmt.Errorf("--env %q: want KEY=VALUE", kv)
			}
			if rc.EnvVars == nil {
				rc.EnvVars = map[string]string{}
			}
			rc.EnvVars[k] = v
		}
		req.RunConfig = rc
	}
	return req, nil
}

func runExec(cmd *cobra.Command, name string, argv []string, f execFlags) error {
	req, err := f.execRequest(argv)
	if err != nil {
		return err
	}
	c, err := clientFromEnv()
	if err != nil {
		return err
	}
	req.Stdout, req.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	if f.stdin {
		req.Stdin = cmd.InOrStdin()
	}
	// Under a raw terminal ^C travels to the remote command as input; these
	// signals then only arrive from outside, and kill the command.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if f.tty {
		restore, err := setupTerminal(ctx, &req)
		if err != nil {
			return err
		}
		defer restore()
	}
	code, err := c.Exec(ctx, name, req)
	if err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return exitCode(130) // interrupted, as a shell reports it
		}
		return err
	}
	if code != 0 {
		return exitCode(code)
	}
	return nil
}

// setupTerminal sizes the remote PTY from the local terminal, follows
// window changes, and puts a terminal stdin in raw mode when stdin is
// forwarded. restore undoes the raw mode.
func setupTerminal(ctx context.Context, req *cubicle.ExecRequest) (restore func(), err error) {
	restore = func() {}
	if fd, ok := terminalFd(req.Stdout); ok {
		if cols, rows, err := term.GetSize(fd); err == nil {
			req.Rows, req.Cols = rows, cols
		}
		resize := make(chan cubicle.WindowSize, 1)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		go func() {
			defer signal.Stop(winch)
			for {
				select {
				case <-ctx.Done():
					return
				case <-winch:
					if cols, rows, err := term.GetSize(fd); err == nil {
						select {
						case resize <- cubicle.WindowSize{Rows: rows, Cols: cols}:
						default: // one pending size is enough; the next signal brings the latest
						}
					}
				}
			}
		}()
		req.Resize = resize
	}
	if fd, ok := terminalFd(req.Stdin); ok {
		state, err := term.MakeRaw(fd)
		if err != nil {
			return restore, fmt.Errorf("raw terminal: %w", err)
		}
		restore = func() { _ = term.Restore(fd, state) }
	}
	return restore, nil
}
