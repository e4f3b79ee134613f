package storage

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/health"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Space measures the store's filesystem and, for a loop image, the host
// filesystem under it (whose free space bounds what the sparse image can
// still take).
func (c *CoW) Space() (protocol.StoreSpace, error) {
	st, err := statFS(c.root)
	if err != nil {
		return protocol.StoreSpace{}, err
	}
	sp := protocol.StoreSpace{Store: st, Usable: st.Free}
	if c.image != "" {
		h, err := statFS(filepath.Dir(c.image))
		if err != nil {
			return protocol.StoreSpace{}, err
		}
		sp.Host = &h
		sp.Usable = min(sp.Usable, h.Free)
	}
	if c.btrfs() {
		if sp.Metadata, err = metadataSpace(c.root, st.Total); err != nil {
			return protocol.StoreSpace{}, err
		}
	}
	return sp, nil
}

func statFS(path string) (protocol.FSSpace, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return protocol.FSSpace{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := s.Bsize
	return protocol.FSSpace{
		Path: path, Total: int64(s.Blocks) * bs, Used: int64(s.Blocks-s.Bfree) * bs, Free: int64(s.Bavail) * bs,
		ReadOnly: s.Flags&unix.ST_RDONLY != 0,
	}, nil
}

// Check is the store's health probe: an error when it has turned read-only,
// has less than reserve bytes usable or less btrfs metadata free than its
// reserve (the daemon must not create sandboxes then), a warning
// (health.Warn) when under twice either reserve.
func (c *CoW) Check(reserve int64) func(context.Context) error {
	return func(context.Context) error {
		sp, err := c.Space()
		if err != nil {
			return err
		}
		switch {
		case sp.Store.ReadOnly:
			return errors.New("copy-on-write store is read-only")
		case sp.Host != nil && sp.Host.ReadOnly:
			return fmt.Errorf("host filesystem of %s is read-only", c.image)
		case sp.Usable < reserve:
			return fmt.Errorf("%s usable, below the %s reserve", humanize.IBytes(uint64(max(sp.Usable, 0))), humanize.IBytes(uint64(reserve)))
		case sp.Metadata != nil && sp.Metadata.Free < sp.Metadata.Reserve:
			return fmt.Errorf("btrfs metadata low: %s free, below the %s reserve", humanize.IBytes(uint64(sp.Metadata.Free)), humanize.IBytes(uint64(sp.Metadata.Reserve)))
		case sp.Usable < 2*reserve:
			return health.Warn(fmt.Errorf("low space: %s usable (reserve %s)", humanize.IBytes(uint64(max(sp.Usable, 0))), humanize.IBytes(uint64(reserve))))
		case sp.Metadata != nil && sp.Metadata.Free < 2*sp.Metadata.Reserve:
			return health.Warn(fmt.Errorf("btrfs metadata low: %s free (reserve %s)", humanize.IBytes(uint64(sp.Metadata.Free)), humanize.IBytes(uint64(sp.Metadata.Reserve))))
		}
		return nil
	}
}
