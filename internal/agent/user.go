package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// identity is who a command runs as, resolved from the sandbox's own
// /etc/passwd and /etc/group (never the host's: the agent's root is the
// sandbox root).
type identity struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups, including gid
	home   string
	// change is false when no user was requested: the command keeps the
	// agent's credentials.
	change bool
}

// startDir is where id's commands start without a work_dir, and what a
// relative file path resolves against: its home when that is a directory,
// else "/".
func (id identity) startDir() string {
	if st, err := os.Stat(id.home); err == nil && st.IsDir() {
		return filepath.Clean(id.home)
	}
	return "/"
}

// passwdEntry is one line of /etc/passwd.
type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// lookupIdentity resolves spec ("", "name", "uid", "name:group", "uid:gid")
// against the passwd and group files under root.
func lookupIdentity(root, spec string) (identity, error) {
	users, err := readPasswd(filepath.Join(root, "etc/passwd"))
	if err != nil {
		return identity{}, err
	}
	if spec == "" {
		id := identity{uid: uint32(os.Getuid()), gid: uint32(os.Getgid()), home: "/"}
		if e, ok := findUser(users, strconv.Itoa(os.Getuid())); ok {
			id.name, id.home = e.name, e.home
		}
		return id, nil
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	id := identity{change: true, home: "/"}
	if e, ok := findUser(users, userPart); ok {
		id.name, id.uid, id.gid, id.home = e.name, e.uid, e.gid, e.home
	} else if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		id.uid = uint32(n) // unknown numeric uid: primary group 0, home /
	} else {
		return identity{}, fmt.Errorf("user %q not found in /etc/passwd", userPart)
	}
	groups, err := readGroups(filepath.Join(root, "etc/group"))
	if err != nil {
		return identity{}, err
	}
	if hasGroup {
		g, ok := findGroup(groups, groupPart)
		if !ok {
			return identity{}, fmt.Errorf("group %q not found in /etc/group", groupPart)
		}
		id.gid = g.gid
	}
	id.groups = []uint32{id.gid}
	for _, g := range groups {
		if g.gid != id.gid && id.name != "" && contains(g.members, id.name) {
			id.groups = append(id.groups, g.gid)
		}
	}
	return id, nil
}

func findUser(users []passwdEntry, key string) (passwdEntry, bool) {
	for _, u := range users {
		if u.name == key {
			return u, true
		}
	}
	if n, err := strconv.ParseUint(key, 10, 32); err == nil {
		for _, u := range users {
			if u.uid == uint32(n) {
				return u, true
			}
		}
	}
	return passwdEntry{}, false
}

// groupEntry is one line of /etc/group.
type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

func findGroup(groups []groupEntry, key string) (groupEntry, bool) {
	for _, g := range groups {
		if g.name == key {
			return g, true
		}
	}
	if n, err := strconv.ParseUint(key, 10, 32); err == nil {
		for _, g := range groups {
			if g.gid == uint32(n) {
				return g, true
			}
		}
		return groupEntry{gid: uint32(n)}, true
	}
	return groupEntry{}, false
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// readPasswd parses an /etc/passwd file; a missing file is an empty list.
func readPasswd(path string) ([]passwdEntry, error) {
	var out []passwdEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 6 {
			return
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return
		}
		out = append(out, passwdEntry{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]})
	})
	return out, err
}

// readGroups parses an /etc/group file; a missing file is an empty list.
func readGroups(path string) ([]groupEntry, error) {
	var out []groupEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 3 {
			return
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return
		}
		g := groupEntry{name: f[0], gid: uint32(gid)}
		if len(f) > 3 && f[3] != "" {
			g.members = strings.Split(f[3], ",")
		}
		out = append(out, g)
	})
	return out, err
}

func readColonFile(path string, line func([]string)) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		line(strings.Split(t, ":"))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}
