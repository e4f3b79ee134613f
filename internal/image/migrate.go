package image

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// layoutVersion is written to <root>/version once names are per workspace.
const layoutVersion = "2"

// legacyWorkspace owns what a store held before names were per workspace:
// such stores served the default workspace.
const legacyWorkspace = "default"

// migrate brings a store written before names were per workspace to the
// current layout, once: its names, and its images no name pointed at
// (kept as untagged), go to legacyWorkspace, so an upgrade loses nothing
// and GC does not take them.
func (s *Store) migrate() error {
	vp := filepath.Join(s.root, "version")
	if b, err := os.ReadFile(vp); err == nil && strings.TrimSpace(string(b)) == layoutVersion {
		return nil
	}
	des, err := os.ReadDir(filepath.Join(s.root, "refs"))
	if err != nil {
		return fmt.Errorf("migrate: list refs: %w", err)
	}
	named := map[string]bool{}
	for _, de := range des {
		p := filepath.Join(s.root, "refs", de.Name())
		var e refEntry
		if err := readJSON(p, &e); err != nil {
			continue
		}
		named[e.Digest] = true
		if e.Workspace != "" {
			continue
		}
		e.Workspace = legacyWorkspace
		if err := s.writeJSON(s.entryPath(e), e); err != nil {
			return fmt.Errorf("migrate ref %s: %w", e.Ref, err)
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("migrate ref %s: %w", e.Ref, err)
		}
	}
	recs, err := os.ReadDir(filepath.Join(s.root, "images"))
	if err != nil {
		return fmt.Errorf("migrate: list images: %w", err)
	}
	for _, de := range recs {
		h, ok := strings.CutSuffix(de.Name(), ".json")
		if !ok || named["sha256:"+h] {
			continue
		}
		e := refEntry{Workspace: legacyWorkspace, Digest: "sha256:" + h}
		if err := s.writeJSON(s.entryPath(e), e); err != nil {
			return fmt.Errorf("migrate image %s: %w", e.Digest, err)
		}
	}
	if err := s.writeFileAtomic(vp, []byte(layoutVersion+"\n")); err != nil {
		return fmt.Errorf("migrate: record layout version: %w", err)
	}
	return nil
}
