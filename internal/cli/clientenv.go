package cli

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"golang.org/x/term"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// Environment of the client commands (snapshot, sandbox, exec, cp).
const (
	envEndpoint     = "CUBICLE_ENDPOINT"
	envAPIKey       = "CUBICLE_API_KEY"
	defaultEndpoint = "http://127.0.0.1:8080"
)

// clientFromEnv builds the SDK client the client commands share, from
// CUBICLE_ENDPOINT (default http://127.0.0.1:8080) and CUBICLE_API_KEY. It
// runs inside RunE, so --help works without a key.
func clientFromEnv(opts ...cubicle.Option) (*cubicle.Client, error) {
	key := os.Getenv(envAPIKey)
	if key == "" {
		// Say how to get a key, not just which variable is missing.
		return nil, errors.New(envAPIKey + " is not set: the daemon prints an admin key on its first start " +
			"and keeps it in <data-dir>/admin.key, e.g. export " + envAPIKey + "=$(cat /var/lib/cubicle/admin.key)")
	}
	endpoint := os.Getenv(envEndpoint)
	if endpoint == "" {
		endpoint = defaultEndpoint
	}
	return cubicle.New(endpoint, key, opts...), nil
}

// parseByteSize reads a size such as "512MiB", "1GiB", "10GB" or
// "1073741824" (plain bytes). Units follow go-humanize: KiB/MiB/GiB are
// powers of 1024, KB/MB/GB powers of 1000.
func parseByteSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("size %q is negative", s)
		}
		return n, nil
	}
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("size %q: want bytes or a unit like 512MiB or 10GiB", s)
	}
	if n > 1<<62 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(n), nil
}

// shellJoin turns argv into one command line for `sh -c` that runs exactly
// argv. A single argument is passed through untouched, so the user may write
// a whole script as one quoted argument (`cubicle exec box -- 'ls | wc'`).
func shellJoin(argv []string) string {
	if len(argv) == 1 {
		return argv[0]
	}
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	return strings.Join(quoted, " ")
}

// shellQuote quotes s for a POSIX shell, leaving plainly safe words bare.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// terminalFd returns the file descriptor of w or r when it is a terminal.
func terminalFd(f any) (int, bool) {
	file, ok := f.(*os.File)
	if !ok || !term.IsTerminal(int(file.Fd())) {
		return 0, false
	}
	return int(file.Fd()), true
}

// ago renders a creation time for tables.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return humanize.Time(t)
}

// orDash renders empty table cells.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
