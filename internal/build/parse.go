// Package build turns a Dockerfile and a build context into snapshot
// layers, server side. Parse checks the Dockerfile with buildkit's own
// parser and refuses what Cubicle cannot build (a FieldError on
// "dockerfile" naming the line); Builder runs the stages a target needs,
// step by step, over a Worker (the sandbox manager: RUN in a build
// sandbox, COPY/ADD written into a fresh layer) and a Cache of step
// results keyed by the chain of what each step depends on (cache.go).
package build

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// MaxDockerfileBytes bounds the Dockerfile text a build accepts.
const MaxDockerfileBytes = 1 << 20

// Plan is a parsed, checked Dockerfile: its stages in order, the global
// ARGs declared before the first FROM, and the stage the build produces.
type Plan struct {
	Stages   []instructions.Stage
	MetaArgs []instructions.ArgCommand
	// Target is the index in Stages of the stage whose result is the build's.
	Target int
}

// Parse parses dockerfile and checks that every instruction of it is one
// Builder supports. target names the stage to build ("" is the last).
func Parse(dockerfile []byte, target string) (*Plan, error) {
	if len(dockerfile) > MaxDockerfileBytes {
		return nil, errdefs.Field("dockerfile", "is over %d bytes", MaxDockerfileBytes)
	}
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return nil, lineError(err)
	}
	stages, meta, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return nil, lineError(err)
	}
	if len(stages) == 0 {
		return nil, errdefs.Field("dockerfile", "has no FROM instruction")
	}
	p := &Plan{Stages: stages, MetaArgs: meta, Target: len(stages) - 1}
	if target != "" {
		i, ok := instructions.HasStage(stages, target)
		if !ok {
			return nil, errdefs.Field("target", "no stage named %q in the Dockerfile", target)
		}
		p.Target = i
	}
	for _, st := range stages {
		for _, c := range st.Commands {
			if err := supported(c); err != nil {
				return nil, errdefs.Field("dockerfile", "line %d: %s: %v", line(c.Location()), strings.ToUpper(c.Name()), err)
			}
		}
	}
	return p, nil
}

// supported returns why c cannot be built here, or nil.
func supported(c instructions.Command) error {
	switch c := c.(type) {
	case *instructions.RunCommand:
		if len(c.FlagsUsed) > 0 {
			return fmt.Errorf("flags %v are not supported", c.FlagsUsed)
		}
		if len(c.Files) > 0 {
			return errors.New("heredocs are not supported")
		}
	case *instructions.CopyCommand:
		if c.Link || c.Parents || len(c.ExcludePatterns) > 0 {
			return errors.New("--link, --parents and --exclude are not supported")
		}
		return checkSources(c.SourcesAndDest, c.Chown)
	case *instructions.AddCommand:
		if c.Link || len(c.ExcludePatterns) > 0 || c.Checksum != "" || c.KeepGitDir != nil {
			return errors.New("--link, --exclude, --checksum and --keep-git-dir are not supported")
		}
		for _, s := range c.SourcePaths {
			if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
				return fmt.Errorf("remote source %q is not supported; download it in a RUN step", s)
			}
		}
		return checkSources(c.SourcesAndDest, c.Chown)
	case *instructions.EnvCommand, *instructions.ArgCommand, *instructions.WorkdirCommand,
		*instructions.UserCommand, *instructions.LabelCommand, *instructions.ExposeCommand,
		*instructions.EntrypointCommand, *instructions.CmdCommand, *instructions.ShellCommand,
		*instructions.MaintainerCommand:
	default:
		return errors.New("this instruction is not supported")
	}
	return nil
}

func checkSources(sd instructions.SourcesAndDest, chown string) error {
	if len(sd.SourceContents) > 0 {
		return errors.New("heredocs are not supported")
	}
	if chown != "" {
		if _, _, err := parseChown(chown); err != nil {
			return err
		}
	}
	return nil
}

// parseChown parses a numeric --chown=UID[:GID] (names would need the
// layer stack's /etc/passwd).
func parseChown(s string) (uid, gid int, err error) {
	u, g, hasGroup := strings.Cut(s, ":")
	if uid, err = strconv.Atoi(u); err != nil || uid < 0 {
		return 0, 0, fmt.Errorf("--chown=%s: only numeric UID[:GID] is supported", s)
	}
	gid = uid
	if hasGroup {
		if gid, err = strconv.Atoi(g); err != nil || gid < 0 {
			return 0, 0, fmt.Errorf("--chown=%s: only numeric UID[:GID] is supported", s)
		}
	}
	return uid, gid, nil
}

// lineError turns a buildkit parse error into a FieldError on
// "dockerfile" that names the line.
func lineError(err error) error {
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 {
		return errdefs.Field("dockerfile", "line %d: %v", line(le.Locations[0]), le.Unwrap())
	}
	return errdefs.Field("dockerfile", "%v", err)
}

func line(r []parser.Range) int {
	if len(r) == 0 {
		return 0
	}
	return r[0].Start.Line
}
