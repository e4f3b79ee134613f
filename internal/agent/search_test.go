package agent

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range files {
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestGlob(t *testing.T) {
	c, _, _ := startAgent(t)
	root := writeTree(t, map[string]string{
		"a.py": "x", "b.txt": "y", "src/c.py": "z", "src/deep/d.py": "w", "src/deep/e.go": "v",
	})
	cases := map[string][]string{
		"*":       {"a.py", "b.txt", "src"},
		"*.py":    {"a.py"},
		"**/*.py": {"a.py", "src/c.py", "src/deep/d.py"},
		"src/*":   {"src/c.py", "src/deep"},
		"src/**":  {"src", "src/c.py", "src/deep", "src/deep/d.py", "src/deep/e.go"},
		"?.txt":   {"b.txt"},
		"[ab].*":  {"a.py", "b.txt"},
	}
	for pat, want := range cases {
		res, err := globAll(t, c, GlobRequest{Pattern: pat, Path: root})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range res.Matches {
			got = append(got, strings.TrimPrefix(m.Path, root+"/"))
			if m.Path == root+"/src" && !m.IsDir || m.Path == root+"/a.py" && (m.SizeBytes != 1 || m.ModifiedAt == nil) {
				t.Errorf("%+v", m)
			}
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(want, ",") || res.Truncated {
			t.Errorf("%s: got %v want %v", pat, got, want)
		}
	}
	res, err := globAll(t, c, GlobRequest{Pattern: "**", Path: root, Limit: 2})
	if err != nil || len(res.Matches) != 2 || !res.Truncated {
		t.Fatalf("limit: %+v %v", res, err)
	}
}

func TestGrep(t *testing.T) {
	c, _, _ := startAgent(t)
	root := writeTree(t, map[string]string{
		"a.py": "import os\nprint('needle.*')\n", "b.txt": "needle.* here\nno\n", "src/c.py": "x\ny\nneedle.*\n",
		"bin.dat": "needle.*\x00\x01",
	})
	res, err := grepAll(t, c, GrepRequest{Pattern: "needle.*", Path: root, Glob: "*.py"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range res.Matches {
		got = append(got, strings.TrimPrefix(m.Path, root+"/")+":"+itoaT(m.Line)+":"+m.Text)
	}
	sort.Strings(got)
	if strings.Join(got, "|") != "a.py:2:print('needle.*')|src/c.py:3:needle.*" {
		t.Fatalf("%v", got)
	}
	res, _ = grepAll(t, c, GrepRequest{Pattern: "needle", Path: root})
	if len(res.Matches) != 3 || res.Truncated { // bin.dat is skipped as binary
		t.Fatalf("%+v", res)
	}
	res, _ = grepAll(t, c, GrepRequest{Pattern: "needle", Path: root, Glob: "src/**", Limit: 5})
	if len(res.Matches) != 1 {
		t.Fatalf("%+v", res)
	}
	res, _ = grepAll(t, c, GrepRequest{Pattern: "needle", Path: root, Limit: 1})
	if len(res.Matches) != 1 || !res.Truncated {
		t.Fatalf("%+v", res)
	}
}

func itoaT(n int) string { return strconv.Itoa(n) }
