package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/spf13/cobra"
)

// newAuditCmd is `cubicle audit NAME`: a sandbox's record as a timeline.
func newAuditCmd() *cobra.Command {
	var (
		follow, asJSON, byID bool
		kinds                []string
		step, since          int64
	)
	cmd := &cobra.Command{
		Use:   "audit NAME",
		Short: "Show what happened in a sandbox: lifecycle and every command, one line per event",
		Long: "Show a sandbox's audit record: lifecycle events and every command run in it (with exit code, duration and output size).\n" +
			"--step N shows one command with its captured output; --follow keeps streaming new events; --json prints the events as JSON lines.\n" +
			"--id reads by sandbox id, which works for a workspace admin after the sandbox is deleted.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if step > 0 {
				st, err := c.AuditStep(cmd.Context(), args[0], step)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(out).Encode(st)
				}
				printStep(out, st)
				return nil
			}
			o := cubicle.AuditOptions{SinceSeq: since, Kinds: kinds}
			_, tty := terminalFd(out)
			colour := tty && os.Getenv("NO_COLOR") == ""
			show := func(e protocol.AuditEvent) error {
				if asJSON {
					return json.NewEncoder(out).Encode(e)
				}
				line := timelineLine(e)
				if colour {
					line = colourKind(e.Kind, line)
				}
				_, err := fmt.Fprintln(out, line)
				return err
			}
			if follow {
				return c.FollowAudit(cmd.Context(), args[0], o, show)
			}
			o.Limit = 1000
			for {
				page := c.Audit
				if byID {
					page = c.AuditByID
				}
				l, err := page(cmd.Context(), args[0], o)
				if err != nil {
					return err
				}
				for _, e := range l.Items {
					if err := show(e); err != nil {
						return err
					}
				}
				if len(l.Items) < o.Limit {
					return nil
				}
				o.SinceSeq = l.NextSeq
			}
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&follow, "follow", "f", false, "keep streaming new events as they happen")
	fl.BoolVar(&asJSON, "json", false, "print events as JSON, one per line")
	fl.BoolVar(&byID, "id", false, "NAME is a sandbox id (reads deleted sandboxes' records, as a workspace admin)")
	fl.StringSliceVar(&kinds, "kind", nil, "only these kinds: lifecycle, command, file, network, package (comma-separated)")
	fl.Int64Var(&step, "step", 0, "show one command (its step number) with its output")
	fl.Int64Var(&since, "since", 0, "only events after this sequence number")
	cmd.AddCommand(newAuditDiffCmd())
	return cmd
}

// commandData is the part of command events' data the timeline shows.
type commandData struct {
	Command     string   `json:"command"`
	Cwd         string   `json:"cwd"`
	User        string   `json:"user"`
	EnvKeys     []string `json:"env_keys"`
	PTY         bool     `json:"pty"`
	ExitCode    *int     `json:"exit_code"`
	DurationMS  int64    `json:"duration_ms"`
	StdoutBytes int64    `json:"stdout_bytes"`
	StderrBytes int64    `json:"stderr_bytes"`
	Killed      string   `json:"killed"`
	Error       string   `json:"error"`
	Lost        string   `json:"lost"`
	Reason      string   `json:"reason"`
}

// timelineLine renders one event: seq, time, actor, then what happened.
func timelineLine(e protocol.AuditEvent) string {
	head := fmt.Sprintf("%5d  %s  %-12s  ", e.Seq, e.Time.Local().Format("2006-01-02 15:04:05.000"), actorName(e.Actor))
	switch e.Kind {
	case protocol.KindFile:
		if e.Type == protocol.EventFileChanged {
			return head + fmt.Sprintf("#%-4d ", e.Step) + filesSummary(e.Data)
		}
	case protocol.KindPackage:
		var p protocol.PackageChange
		_ = json.Unmarshal(e.Data, &p)
		s := fmt.Sprintf("#%-4d %s %s %s %s", e.Step, strings.TrimPrefix(e.Type, "package."), p.Ecosystem, p.Name, p.Version)
		if p.PreviousVersion != "" {
			s += " (was " + p.PreviousVersion + ")"
		}
		return head + s
	case protocol.KindNetwork:
		return head + fmt.Sprintf("%-9s ", e.Kind) + networkLine(e)
	}
	if e.Kind != protocol.KindCommand {
		return head + fmt.Sprintf("%-9s %s", e.Kind, e.Type) + dataSummary(e.Data)
	}
	var d commandData
	_ = json.Unmarshal(e.Data, &d)
	step := fmt.Sprintf("#%-4d ", e.Step)
	switch e.Type {
	case protocol.EventCommandStarted:
		s := head + step + "$ " + d.Command
		var ctx []string
		if d.User != "" {
			ctx = append(ctx, "user "+d.User)
		}
		if d.Cwd != "" {
			ctx = append(ctx, "cwd "+d.Cwd)
		}
		if len(d.EnvKeys) > 0 {
			ctx = append(ctx, "env "+strings.Join(d.EnvKeys, ","))
		}
		if d.PTY {
			ctx = append(ctx, "pty")
		}
		if len(ctx) > 0 {
			s += "   (" + strings.Join(ctx, ", ") + ")"
		}
		return s
	case protocol.EventCommandExited:
		var how string
		switch {
		case d.Lost != "":
			how = "lost: " + d.Lost
		case d.ExitCode != nil:
			how = fmt.Sprintf("exit %d", *d.ExitCode)
		case d.Error != "":
			how = d.Error
		default:
			how = "ended"
		}
		if d.Killed != "" {
			how += " (killed: " + d.Killed + ")"
		}
		return head + step + fmt.Sprintf("→ %s in %s, stdout %d B, stderr %d B", how,
			(time.Duration(d.DurationMS)*time.Millisecond).String(), d.StdoutBytes, d.StderrBytes)
	case protocol.EventCommandKilled:
		return head + step + "✗ killed (" + d.Reason + ")"
	default:
		return head + step + strings.TrimPrefix(e.Type, "command.")
	}
}

// filesSummary is a file.changed event as counts and its first paths.
func filesSummary(raw json.RawMessage) string {
	var d protocol.FileChanges
	_ = json.Unmarshal(raw, &d)
	s := fmt.Sprintf("files +%d ~%d -%d", d.AddedCount, d.ModifiedCount, d.DeletedCount)
	if d.At != "" {
		s += " (at " + d.At + ")"
	}
	var paths []string
	for _, a := range d.Added {
		paths = append(paths, "+"+a.Path)
	}
	for _, m := range d.Modified {
		paths = append(paths, "~"+m.Path)
	}
	for _, p := range d.Deleted {
		paths = append(paths, "-"+p)
	}
	const shown = 3
	if len(paths) > shown {
		paths = append(paths[:shown], "…")
	}
	if len(paths) > 0 {
		s += "  " + strings.Join(paths, " ")
	}
	return s
}

func actorName(a protocol.Actor) string {
	if a.KeyPrefix != "" {
		return a.User + "/" + a.KeyPrefix
	}
	return a.User
}

// dataSummary is an event's data as " k=v k=v", keys sorted.
func dataSummary(raw json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil || len(m) == 0 {
		return ""
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v, _ := json.Marshal(m[k])
		fmt.Fprintf(&b, " %s=%s", k, strings.Trim(string(v), `"`))
	}
	return b.String()
}

// printStep shows one command: its events, then each stream's output
// (head and tail, with what was dropped between them).
func printStep(w io.Writer, st *protocol.AuditStep) {
	for _, e := range st.Events {
		fmt.Fprintln(w, timelineLine(e))
	}
	for _, s := range []struct {
		name string
		o    *protocol.CommandOutput
	}{{"stdout", st.Stdout}, {"stderr", st.Stderr}} {
		if s.o == nil {
			continue
		}
		fmt.Fprintf(w, "--- %s (%d bytes) ---\n%s", s.name, s.o.TotalBytes, s.o.Head)
		if s.o.Truncated {
			fmt.Fprintf(w, "\n[… %d bytes not kept …]\n", s.o.TotalBytes-int64(len(s.o.Head)+len(s.o.Tail)))
		}
		fmt.Fprint(w, s.o.Tail)
		if !strings.HasSuffix(s.o.Head+s.o.Tail, "\n") {
			fmt.Fprintln(w)
		}
	}
}

// kindColours are the timeline's ANSI colours by event kind.
var kindColours = map[string]string{
	protocol.KindLifecycle: "\x1b[35m", // magenta
	protocol.KindCommand:   "\x1b[1m",  // bold
	protocol.KindFile:      "\x1b[32m", // green
	protocol.KindNetwork:   "\x1b[36m", // cyan
	protocol.KindPackage:   "\x1b[33m", // yellow
}

// colourKind colours a timeline line by its event's kind.
func colourKind(kind, line string) string {
	if c, ok := kindColours[kind]; ok {
		return c + line + "\x1b[0m"
	}
	return line
}
