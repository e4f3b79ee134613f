package e2e

import (
	"os"
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
	return c
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
