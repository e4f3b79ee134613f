package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// Base is what a FROM (or COPY --from) names outside the Dockerfile: an
// image or another snapshot.
type Base struct {
	// Key identifies the base's content: the first link of every cache
	// key of the stages built on it.
	Key    string
	Layers []string
	Config protocol.RunConfig
	// Release lets go of the base once the build's result is recorded
	// (or the build failed); nil is nothing to release.
	Release func()
}

// Layer is one step's result: a read-only layer directory and the id
// it is stored under (for removal when the cache prunes it).
type Layer struct{ ID, Path string }

// RunSpec is a RUN step's command and the environment it runs in.
type RunSpec struct {
	Command string
	Shell   string
	Config  protocol.RunConfig
}

// ExitError is a RUN step whose command exited non-zero.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return "exit code " + strconv.Itoa(e.Code) }

// Worker does the steps that touch layers. The sandbox manager implements
// it; tests fake it.
type Worker interface {
	// Base resolves a FROM reference: a snapshot by name, else an image.
	Base(ctx context.Context, ref string) (Base, error)
	// Run runs spec in a build sandbox over layers, copying its output
	// to out, and captures what it wrote as a new layer. A non-zero exit
	// is an *ExitError and leaves no layer.
	Run(ctx context.Context, layers []string, spec RunSpec, out io.Writer) (Layer, error)
	// Layer makes a new layer from what fill writes into an empty root.
	Layer(ctx context.Context, fill func(*os.Root) error) (Layer, error)
	// Open makes layers readable as one tree (COPY --from) until done.
	Open(ctx context.Context, layers []string) (root string, done func(), err error)
}

// Cache holds step results by key (see stepKey).
type Cache interface {
	Get(ctx context.Context, key string) (Layer, bool, error)
	Put(ctx context.Context, key string, l Layer) error
}

// Options are one build's inputs besides the plan.
type Options struct {
	BuildArgs map[string]string
	// NoCache runs every step; results still go to the cache.
	NoCache bool
	// Context is the directory of the (already .dockerignore-filtered)
	// build context.
	Context string
	// Log receives the step log: one header line per instruction, a
	// CACHED or DONE line per layer step, and RUN output.
	Log io.Writer
}

// Result is a built target stage.
type Result struct {
	Layers     []string
	Config     protocol.RunConfig
	Labels     map[string]string
	Cmd        []string
	Entrypoint []string
	// BaseRef is what the target's first FROM named outside the file.
	BaseRef string
	// Steps counts the layer steps (RUN, COPY, ADD, WORKDIR) run or
	// taken from the cache; Cached those taken from the cache.
	Steps, Cached int
	releases      []func()
}

// StartCommand is the shell command ENTRYPOINT and CMD give ("" for
// none): CMD's argv after ENTRYPOINT's, as Docker runs them.
func (r *Result) StartCommand() string {
	argv := append(slices.Clone(r.Entrypoint), r.Cmd...)
	if len(argv) == 0 {
		return ""
	}
	return quoteArgv(argv)
}

// Release lets go of every base the build resolved.
func (r *Result) Release() {
	for _, f := range r.releases {
		f()
	}
	r.releases = nil
}

// StepError is a failed step: which one, and its output's tail.
type StepError struct {
	Step   string
	Line   int
	Output string
	Err    error
}

func (e *StepError) Error() string {
	msg := fmt.Sprintf("step %s (line %d): %v", e.Step, e.Line, e.Err)
	if e.Output != "" {
		msg += "\noutput:\n" + e.Output
	}
	return msg
}

func (e *StepError) Unwrap() error { return e.Err }

// stageState is a stage as built so far.
type stageState struct {
	key        string // cache key of the top of layers
	layers     []string
	cfg        protocol.RunConfig
	args       map[string]string // ARGs in scope, by name
	shell      []string
	labels     map[string]string
	cmd, entry []string
	baseRef    string
}

// builder runs one Plan.
type builder struct {
	plan   *Plan
	w      Worker
	cache  Cache
	o      Options
	meta   map[string]string // global ARGs, after build args
	done   map[int]*stageState
	res    *Result
	step   int
	nsteps int
}

// Build runs the stages plan's target needs and returns the target's
// result. Release the result once its layers are recorded; on error
// every base is already released.
func Build(ctx context.Context, plan *Plan, w Worker, cache Cache, o Options) (res *Result, err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	b := &builder{plan: plan, w: w, cache: cache, o: o, meta: map[string]string{}, done: map[int]*stageState{}, res: &Result{}}
	defer func() {
		if err != nil {
			b.res.Release()
		}
	}()
	for _, a := range plan.MetaArgs {
		for _, kv := range a.Args {
			b.meta[kv.Key] = argValue(kv, o.BuildArgs, nil)
		}
	}
	order, err := b.needed()
	if err != nil {
		return nil, err
	}
	for _, i := range order {
		b.nsteps += 1 + len(plan.Stages[i].Commands)
	}
	for _, i := range order {
		if err := b.buildStage(ctx, i); err != nil {
			return nil, err
		}
	}
	t := b.done[plan.Target]
	b.res.Layers, b.res.Config, b.res.Labels = t.layers, t.cfg, t.labels
	b.res.Cmd, b.res.Entrypoint, b.res.BaseRef = t.cmd, t.entry, t.baseRef
	return b.res, nil
}

// needed lists, in file order, the stages the target depends on.
func (b *builder) needed() ([]int, error) {
	need := map[int]bool{}
	var visit func(i int) error
	visit = func(i int) error {
		if need[i] {
			return nil
		}
		need[i] = true
		st := b.plan.Stages[i]
		base, err := b.expandMeta(st.BaseName)
		if err != nil {
			return err
		}
		deps := []string{base}
		for _, c := range st.Commands {
			if cp, ok := c.(*instructions.CopyCommand); ok && cp.From != "" {
				deps = append(deps, cp.From)
			}
		}
		for _, d := range deps {
			if j, ok := b.stageRef(d, i); ok {
				if err := visit(j); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := visit(b.plan.Target); err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(need)), nil
}

// stageRef resolves a FROM/--from name to an earlier stage of stage i.
func (b *builder) stageRef(name string, i int) (int, bool) {
	if n, err := strconv.Atoi(name); err == nil && n >= 0 && n < i {
		return n, true
	}
	j, ok := instructions.HasStage(b.plan.Stages, strings.ToLower(name))
	return j, ok && j < i
}

func (b *builder) expandMeta(word string) (string, error) {
	out, _, err := shell.NewLex('\\').ProcessWord(word, envOf(b.meta, nil))
	return out, err
}

func (b *builder) header(st *instructions.Stage, text string) string {
	b.step++
	name := st.Name
	if name == "" {
		name = "stage"
	}
	id := fmt.Sprintf("%d/%d", b.step, b.nsteps)
	fmt.Fprintf(b.o.Log, "#%d [%s %s] %s\n", b.step, name, id, text)
	return id
}

// buildStage builds stage i, whose dependencies are built.
func (b *builder) buildStage(ctx context.Context, i int) error {
	st := &b.plan.Stages[i]
	s, err := b.from(ctx, st, i)
	if err != nil {
		return err
	}
	for _, c := range st.Commands {
		if err := b.command(ctx, st, s, c); err != nil {
			return err
		}
	}
	b.done[i] = s
	return nil
}

// from starts stage i's state from its FROM.
func (b *builder) from(ctx context.Context, st *instructions.Stage, i int) (*stageState, error) {
	ref, err := b.expandMeta(st.BaseName)
	text := "FROM " + ref
	if st.Name != "" {
		text += " AS " + st.Name
	}
	id := b.header(st, text)
	if err != nil {
		return nil, &StepError{Step: id, Line: line(st.Location), Err: err}
	}
	s := &stageState{args: map[string]string{}, shell: []string{"/bin/sh", "-c"}, labels: map[string]string{}}
	if j, ok := b.stageRef(ref, i); ok {
		p := b.done[j]
		s.key, s.layers, s.cfg, s.baseRef = p.key, slices.Clip(p.layers), p.cfg.Layer(nil), p.baseRef
		s.shell, s.labels = p.shell, maps.Clone(p.labels)
		s.cmd, s.entry = p.cmd, p.entry
		return s, nil
	}
	if ref == "scratch" {
		s.key, s.baseRef = chain("", "scratch"), "scratch"
		return s, nil
	}
	base, err := b.base(ctx, ref)
	if err != nil {
		return nil, &StepError{Step: id, Line: line(st.Location), Err: err}
	}
	s.key, s.layers, s.cfg, s.baseRef = base.Key, slices.Clip(base.Layers), base.Config.Layer(nil), ref
	return s, nil
}

func (b *builder) base(ctx context.Context, ref string) (Base, error) {
	base, err := b.w.Base(ctx, ref)
	if err != nil {
		return Base{}, fmt.Errorf("resolve %q: %w", ref, err)
	}
	if base.Release != nil {
		b.res.releases = append(b.res.releases, base.Release)
	}
	return base, nil
}

// command applies one instruction to s.
func (b *builder) command(ctx context.Context, st *instructions.Stage, s *stageState, c instructions.Command) error {
	text := fmt.Sprint(c)
	id := b.header(st, text)
	fail := func(err error, out string) error {
		return &StepError{Step: id + " " + strings.ToUpper(c.Name()), Line: line(c.Location()), Output: out, Err: err}
	}
	if ex, ok := c.(instructions.SupportsSingleWordExpansion); ok {
		env := envOf(s.args, s.cfg.EnvVars)
		lex := shell.NewLex('\\')
		if err := ex.Expand(func(w string) (string, error) {
			out, _, err := lex.ProcessWord(w, env)
			return out, err
		}); err != nil {
			return fail(err, "")
		}
	}
	switch c := c.(type) {
	case *instructions.EnvCommand:
		env := maps.Clone(s.cfg.EnvVars)
		if env == nil {
			env = map[string]string{}
		}
		for _, kv := range c.Env {
			env[kv.Key] = kv.Value
		}
		s.cfg.EnvVars = env
	case *instructions.ArgCommand:
		for _, kv := range c.Args {
			s.args[kv.Key] = argValue(kv, b.o.BuildArgs, b.meta)
		}
	case *instructions.UserCommand:
		s.cfg.User = c.User
	case *instructions.LabelCommand:
		for _, kv := range c.Labels {
			s.labels[kv.Key] = kv.Value
		}
	case *instructions.ShellCommand:
		s.shell = c.Shell
	case *instructions.CmdCommand:
		s.cmd = b.cmdLine(s, c.ShellDependantCmdLine)
	case *instructions.EntrypointCommand:
		s.entry = b.cmdLine(s, c.ShellDependantCmdLine)
	case *instructions.ExposeCommand, *instructions.MaintainerCommand:
		// Recorded nowhere: every port of a sandbox is reachable through
		// the service gateway.
	case *instructions.WorkdirCommand:
		dir := absPath(s.cfg.WorkDir, c.Path)
		s.cfg.WorkDir = dir
		return b.layerStep(ctx, s, fail, chain(s.key, "WORKDIR", dir), func(ctx context.Context) (Layer, error) {
			return b.w.Layer(ctx, func(r *os.Root) error { return r.MkdirAll(rel(dir), 0o755) })
		})
	case *instructions.RunCommand:
		return b.run(ctx, s, c, fail)
	case *instructions.CopyCommand:
		return b.copy(ctx, s, copyOp{sd: c.SourcesAndDest, from: c.From, chown: c.Chown, chmod: c.Chmod}, fail)
	case *instructions.AddCommand:
		return b.copy(ctx, s, copyOp{sd: c.SourcesAndDest, chown: c.Chown, chmod: c.Chmod, unpack: c.Unpack == nil || *c.Unpack}, fail)
	}
	return nil
}

// cmdLine is a CMD/ENTRYPOINT as argv: the shell form runs in the
// stage's SHELL.
func (b *builder) cmdLine(s *stageState, cl instructions.ShellDependantCmdLine) []string {
	if cl.PrependShell {
		return append(slices.Clone(s.shell), strings.Join(cl.CmdLine, " "))
	}
	return slices.Clone(cl.CmdLine)
}

func (b *builder) run(ctx context.Context, s *stageState, c *instructions.RunCommand, fail func(error, string) error) error {
	spec := RunSpec{Config: s.cfg.Layer(nil)}
	if len(s.args) > 0 {
		// ARGs are the command's environment, under ENV of the same name.
		env := maps.Clone(s.args)
		maps.Copy(env, s.cfg.EnvVars)
		spec.Config.EnvVars = env
	}
	if c.PrependShell {
		if len(s.shell) != 2 || s.shell[1] != "-c" {
			return fail(fmt.Errorf("SHELL %q: only [\"<shell>\", \"-c\"] is supported", s.shell), "")
		}
		spec.Shell, spec.Command = s.shell[0], strings.Join(c.CmdLine, " ")
	} else {
		spec.Shell, spec.Command = "/bin/sh", quoteArgv(c.CmdLine)
	}
	state, _ := json.Marshal(spec)
	tail := &tailBuffer{max: 4 << 10}
	err := b.layerStep(ctx, s, fail, chain(s.key, "RUN", string(state)), func(ctx context.Context) (Layer, error) {
		return b.w.Run(ctx, s.layers, spec, io.MultiWriter(b.o.Log, tail))
	})
	var se *StepError
	if errors.As(err, &se) {
		se.Output = tail.String()
	}
	return err
}

// layerStep takes key's layer from the cache, or makes it with make and
// caches it, and stacks it on s.
func (b *builder) layerStep(ctx context.Context, s *stageState, fail func(error, string) error, key string, make func(context.Context) (Layer, error)) error {
	b.res.Steps++
	if !b.o.NoCache {
		l, ok, err := b.cache.Get(ctx, key)
		if err != nil {
			return fail(fmt.Errorf("build cache: %w", err), "")
		}
		if ok {
			b.res.Cached++
			fmt.Fprintf(b.o.Log, "#%d CACHED\n", b.step)
			s.key, s.layers = key, append(s.layers, l.Path)
			return nil
		}
	}
	t0 := time.Now()
	l, err := make(ctx)
	if err != nil {
		return fail(err, "")
	}
	if err := b.cache.Put(ctx, key, l); err != nil {
		return fail(fmt.Errorf("build cache: %w", err), "")
	}
	fmt.Fprintf(b.o.Log, "#%d DONE %.2fs\n", b.step, time.Since(t0).Seconds())
	s.key, s.layers = key, append(s.layers, l.Path)
	return nil
}

// chain is a cache key: a digest of the parent's key and what the step
// depends on, so a key names the whole chain of steps under it.
func chain(parent string, parts ...string) string {
	h := sha256.New()
	io.WriteString(h, parent)
	for _, p := range parts {
		fmt.Fprintf(h, "\x00%d:%s", len(p), p)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// argValue is an ARG's value: the build arg, else its default, else the
// global ARG of that name.
func argValue(kv instructions.KeyValuePairOptional, buildArgs, meta map[string]string) string {
	if v, ok := buildArgs[kv.Key]; ok {
		return v
	}
	if kv.Value != nil {
		return *kv.Value
	}
	return meta[kv.Key]
}

// envGetter is shell.EnvGetter over ARGs overlaid with ENV.
type envGetter map[string]string

func envOf(args, env map[string]string) envGetter {
	m := maps.Clone(args)
	if m == nil {
		m = map[string]string{}
	}
	maps.Copy(m, env)
	return m
}

func (e envGetter) Get(k string) (string, bool) { v, ok := e[k]; return v, ok }
func (e envGetter) Keys() []string              { return slices.Sorted(maps.Keys(e)) }

// quoteArgv turns an exec-form argv into one /bin/sh command line.
func quoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return "exec " + strings.Join(q, " ")
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.buf) }
