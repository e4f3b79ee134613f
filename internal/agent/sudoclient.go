package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// SudoMain is sudo in a sandbox (the cubicle binary run as "sudo"): it
// parses sudo's common options, asks the agent's broker to run the
// command (see ServeSudo) with this process's stdin, stdout and stderr,
// forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT, and returns the command's
// exit code. Options: -n (never prompts anyway), -E, -H, -k, -u USER, -s,
// -i, -v, --.
func SudoMain(args []string) int {
	req, err := parseSudoArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\nusage: sudo [-nEHks] [-i] [-u user] command [args...]\n", err)
		return 1
	}
	code, err := sudoCall(SudoSocket, req, [3]*os.File{os.Stdin, os.Stdout, os.Stderr})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
	}
	return code
}

// parseSudoArgs turns sudo's command line into a request.
func parseSudoArgs(args []string) (sudoRequest, error) {
	req := sudoRequest{Env: os.Environ()}
	req.Dir, _ = os.Getwd()
	var shell, login bool
	for len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' {
		a := args[0]
		args = args[1:]
		if a == "--" {
			break
		}
		for i := 1; i < len(a); i++ {
			switch a[i] {
			case 'n', 'H', 'k':
			case 'E':
				req.PreserveEnv = true
			case 's':
				shell = true
			case 'i':
				login = true
			case 'v':
				req.ValidateOnly = true
			case 'u':
				if rest := a[i+1:]; rest != "" {
					req.User = rest
				} else if len(args) > 0 {
					req.User, args = args[0], args[1:]
				} else {
					return req, fmt.Errorf("option -u needs a user")
				}
				i = len(a)
			default:
				return req, fmt.Errorf("unsupported option -%c", a[i])
			}
		}
	}
	switch {
	case shell || login:
		req.Argv = []string{"/bin/bash"}
		if login {
			req.Argv = append(req.Argv, "-l")
			req.Dir = "" // the broker's lookup of the target's home
		}
		if len(args) > 0 {
			req.Argv = append(req.Argv, "-c", shellJoin(args))
		}
	case len(args) > 0:
		req.Argv = args
	case !req.ValidateOnly:
		return req, fmt.Errorf("no command given")
	}
	return req, nil
}

// shellJoin quotes args for bash -c, as sudo -s does.
func shellJoin(args []string) string {
	out := ""
	for i, a := range args {
		if i > 0 {
			out += " "
		}
		out += "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return out
}

// sudoCall sends req with stdio to the broker at path and waits for its
// answer.
func sudoCall(path string, req sudoRequest, stdio [3]*os.File) (int, error) {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return 1, fmt.Errorf("the sandbox's sudo broker is not reachable (%w); sudo works only inside a Cubicle sandbox", err)
	}
	defer conn.Close()
	body, err := json.Marshal(req)
	if err != nil {
		return 1, err
	}
	if _, _, err := conn.WriteMsgUnix(body, unix.UnixRights(int(stdio[0].Fd()), int(stdio[1].Fd()), int(stdio[2].Fd())), nil); err != nil {
		return 1, fmt.Errorf("send request: %w", err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			conn.Write([]byte{byte(sig.(syscall.Signal))})
		}
	}()
	var rep sudoReply
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&rep); err != nil {
		return 1, fmt.Errorf("read answer: %w", err)
	}
	if rep.Error != "" {
		return rep.ExitCode, fmt.Errorf("%s", rep.Error)
	}
	return rep.ExitCode, nil
}
