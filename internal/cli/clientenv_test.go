package cli

import (
	"os/exec"
	"strings"
	"testing"
)

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"1073741824": 1 << 30,
		"512MiB":     512 << 20,
		"1GiB":       1 << 30,
		"10GiB":      10 << 30,
		"1GB":        1e9,
		"1.5GiB":     3 << 29,
		" 64 KiB ":   64 << 10,
		"0":          0,
	} {
		got, err := parseByteSize(in)
		if err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "-5", "12XB"} {
		if _, err := parseByteSize(bad); err == nil {
			t.Errorf("parseByteSize(%q) succeeded", bad)
		}
	}
}

func TestShellJoin(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"ls -la | wc -l"}, "ls -la | wc -l"}, // one arg: a script, untouched
		{[]string{"ls", "-la", "/tmp"}, "ls -la /tmp"},
		{[]string{"echo", "hello world"}, "echo 'hello world'"},
		{[]string{"echo", "it's"}, `echo 'it'\''s'`},
		{[]string{"printf", ""}, "printf ''"},
		{[]string{"echo", "$HOME", "a;b", "*"}, `echo '$HOME' 'a;b' '*'`},
	} {
		if got := shellJoin(tc.argv); got != tc.want {
			t.Errorf("shellJoin(%q) = %s, want %s", tc.argv, got, tc.want)
		}
	}
}

// The quoting survives a real shell: sh -c on the joined line sees exactly
// the original arguments.
func TestShellJoinRoundTripsThroughSh(t *testing.T) {
	argv := []string{"printf", `%s\n`, "a b", "it's", "", `"q"`, "$HOME", "`id`", "x\ny", "é*?[", `back\slash`}
	out, err := exec.Command("/bin/sh", "-c", shellJoin(argv)).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join(argv[2:], "\n") + "\n"
	if string(out) != want {
		t.Errorf("sh saw %q, want %q", out, want)
	}
}

func TestExecRequestFromFlags(t *testing.T) {
	req, err := execFlags{timeout: 5, workdir: "/w", env: []string{"A=1", "B=x=y", "C="}}.execRequest([]string{"env"})
	if err != nil {
		t.Fatal(err)
	}
	rc := req.RunConfig
	if req.Command != "env" || req.Shell != "/bin/sh" || req.Timeout.Seconds() != 5 || rc == nil || rc.WorkDir != "/w" ||
		rc.EnvVars["A"] != "1" || rc.EnvVars["B"] != "x=y" || rc.EnvVars["C"] != "" || len(rc.EnvVars) != 3 {
		t.Errorf("request = %+v, run config %+v", req, rc)
	}
	if _, err := (execFlags{env: []string{"NOEQUALS"}}).execRequest([]string{"env"}); err == nil {
		t.Error("--env without = accepted")
	}
	// No --timeout means no limit, not the protocol's 60 s default.
	if req, err := (execFlags{}).execRequest([]string{"sleep", "100"}); err != nil || req.Timeout >= 0 {
		t.Errorf("default timeout = %v (%v), want no limit (negative)", req.Timeout, err)
	}
}

func TestParseCpArg(t *testing.T) {
	for in, want := range map[string]cpArg{
		"box:/tmp/x": {sandbox: "box", path: "/tmp/x"},
		"box:rel":    {sandbox: "box", path: "rel"},
		"./a:b":      {path: "./a:b"},
		"/abs/a:b":   {path: "/abs/a:b"},
		"-":          {path: "-"},
		":weird":     {path: ":weird"},
		"plain.txt":  {path: "plain.txt"},
		"box:/a:b/c": {sandbox: "box", path: "/a:b/c"},
	} {
		if got := parseCpArg(in); got != want {
			t.Errorf("parseCpArg(%q) = %+v, want %+v", in, got, want)
		}
	}
	if err := checkCpArgs(parseCpArg("a"), parseCpArg("box:rel")); err == nil {
		t.Error("relative sandbox path accepted")
	}
	if err := checkCpArgs(parseCpArg("a:/x"), parseCpArg("b:/y")); err == nil {
		t.Error("sandbox to sandbox accepted")
	}
}
