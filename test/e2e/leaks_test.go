package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/vishvananda/netlink"
)

// counts is what a sandbox leaves on the host while it exists.
type counts struct {
	Links, NetNS, Mounts, StorageDirs, RuntimeDirs int
	// Loops are loop devices backed by a file of the data dir; Subvolumes
	// the btrfs subvolumes of the store outside orphans/ (quarantined data
	// is kept on purpose); Cgroups the per-sandbox cgroups; Runsc the
	// containers runsc knows; NftElements the elements, chains and rules
	// of the daemon's nft tables; Addresses the IPAM records.
	Loops, Subvolumes, Cgroups, Runsc, NftElements, Addresses int
}

// leakCounts counts host-side traces of sandboxes of daemon d.
func leakCounts(t testing.TB, d *daemon) counts {
	var c counts
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "cb") {
			c.Links++
		}
	}
	ents, _ := os.ReadDir("/run/cubicle/netns")
	c.NetNS = len(ents)
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	c.Mounts = strings.Count(string(mounts), d.dataDir)
	for _, dir := range []string{filepath.Join(d.dataDir, "sandboxes"), filepath.Join(d.dataDir, "cow", "sandboxes")} {
		ents, _ = os.ReadDir(dir)
		c.StorageDirs += len(ents)
	}
	ents, _ = os.ReadDir(filepath.Join(d.dataDir, "runtime", d.runtime))
	for _, e := range ents {
		if e.IsDir() && len(e.Name()) == 32 {
			c.RuntimeDirs++
		}
	}
	c.Loops = strings.Count(sh(t, "losetup", "-l", "-n", "-O", "BACK-FILE"), d.dataDir)
	if out, err := exec.Command("btrfs", "subvolume", "list", "-o", filepath.Join(d.dataDir, "cow")).Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && !strings.HasPrefix(f[len(f)-1], "orphans/") {
				c.Subvolumes++
			}
		}
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/cubicle/*")
	top, _ := filepath.Glob("/sys/fs/cgroup/cubicle/*")
	for _, dir := range append(cg, top...) {
		if st, err := os.Stat(dir); err == nil && st.IsDir() && len(filepath.Base(dir)) == 32 {
			c.Cgroups++
		}
	}
	if d.runtime == "gvisor" {
		_, runsc := binaries(t)
		out := sh(t, runsc, "--root", filepath.Join(d.dataDir, "runtime", "gvisor", "runsc"), "list", "-quiet")
		c.Runsc = len(strings.Fields(out))
	}
	c.NftElements = nftElements(t)
	recs, _ := filepath.Glob(filepath.Join(d.dataDir, "network", "*.json"))
	c.Addresses = len(recs)
	return c
}

// nftElements counts the set and map elements, chains and rules of the
// daemon's nft tables.
func nftElements(t testing.TB) int {
	n := 0
	for _, family := range []string{"inet", "ip"} {
		out, err := exec.Command("nft", "-j", "list", "table", family, "cubicle").Output()
		if err != nil {
			continue // not created (yet)
		}
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("nft -j: %v", err)
		}
		for _, obj := range doc.Nftables {
			for kind, raw := range obj {
				switch kind {
				case "chain", "rule":
					n++
				case "set", "map":
					var set struct {
						Elem []json.RawMessage `json:"elem"`
					}
					if err := json.Unmarshal(raw, &set); err != nil {
						t.Fatalf("nft -j %s: %v", kind, err)
					}
					n += len(set.Elem)
				}
			}
		}
	}
	return n
}

// brokenImage pushes the busybox image plus a layer that makes /.cubicle a
// regular file, so the runtime cannot bind the agent there and boot fails.
func brokenImage(t testing.TB) string {
	layer := imagetest.Layer(t, imagetest.File(".cubicle", 0o644, "oops"))
	img, err := mutate.AppendLayers(imagetest.BusyboxImage(t), layer)
	if err != nil {
		t.Fatal(err)
	}
	testImage(t)
	return imagetest.Push(t, registryHost, "cubicle/broken:e2e", img)
}
