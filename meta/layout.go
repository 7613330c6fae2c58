package meta

import (
	"context"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Layout limits.
const (
	minChunkSize   = 64 << 10
	maxChunkSize   = 64 << 20
	maxStripeCount = 128
	maxReplicas    = 8
)

// withLayoutDefaults returns a copy of l with zero fields set to weft's
// defaults.
func withLayoutDefaults(l *weftv1.Layout) *weftv1.Layout {
	out := &weftv1.Layout{ChunkSize: defaultChunkSize, StripeCount: defaultStripeCount, Replicas: defaultReplicas}
	mergeLayout(out, l)
	return out
}

// mergeLayout overrides base's fields with l's non-zero ones.
func mergeLayout(base, l *weftv1.Layout) {
	if l == nil {
		return
	}
	if l.ChunkSize != 0 {
		base.ChunkSize = l.ChunkSize
	}
	if l.StripeCount != 0 {
		base.StripeCount = l.StripeCount
	}
	if l.Replicas != 0 {
		base.Replicas = l.Replicas
	}
	if l.Pool != "" {
		base.Pool = l.Pool
	}
}

// validateLayout checks a complete layout's fields against weft's limits;
// the error names the allowed range.
func validateLayout(l *weftv1.Layout) error {
	cs := l.ChunkSize
	if cs < minChunkSize || cs > maxChunkSize || cs&(cs-1) != 0 {
		return fserr.Wrap(syscall.EINVAL, "invalid chunk size %d: must be a power of two from 64 KiB (65536) to 64 MiB (67108864)", cs)
	}
	if l.StripeCount < 1 || l.StripeCount > maxStripeCount {
		return fserr.Wrap(syscall.EINVAL, "invalid stripe count %d: must be 1 to %d (capped to the chains available when a file is created)",
			l.StripeCount, maxStripeCount)
	}
	if l.Replicas < 1 || l.Replicas > maxReplicas {
		return fserr.Wrap(syscall.EINVAL, "invalid replica count %d: must be 1 to %d", l.Replicas, maxReplicas)
	}
	return nil
}

// placeLayout returns a file layout for template l: chains picked by the
// cluster manager, stripe_count capped to the chains that exist.
func (s *Service) placeLayout(ctx context.Context, l *weftv1.Layout) (*weftv1.Layout, error) {
	out := proto.Clone(l).(*weftv1.Layout)
	n := int(out.StripeCount)
	if avail := s.cluster.NumChains(); n > avail && avail > 0 {
		n = avail
	}
	chains, err := s.cluster.PickChains(ctx, n, out.Replicas)
	if err != nil {
		return nil, err
	}
	out.Chains = chains
	out.StripeCount = uint32(len(chains))
	return out, nil
}

// GetLayout returns a file's layout, or a directory's own default layout
// and the one its new files get.
func (s *Service) GetLayout(ctx context.Context, req *weftv1.GetLayoutRequest) (*weftv1.GetLayoutResponse, error) {
	resp := new(weftv1.GetLayoutResponse)
	err := s.view(ctx, func(x *tx) error {
		a, err := x.inode(req.Ino, "get layout")
		if err != nil {
			return err
		}
		if !isDir(a.Mode) {
			if !isReg(a.Mode) {
				return fserr.Wrap(syscall.EINVAL, "get layout of inode %d: only regular files and directories have a layout", a.Ino)
			}
			resp.Layout, resp.Effective = a.Layout, a.Layout
			return nil
		}
		own, err := x.dirLayout(a.Ino)
		if err != nil {
			return err
		}
		resp.Layout, resp.HasOwn = own, own != nil
		resp.Effective, err = x.effectiveLayout(a.Ino, s.cfg.DefaultLayout)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// SetLayout sets a directory's default layout, inherited by new children
// down the tree, or the layout of an empty regular file. Zero fields keep
// the inherited (or current) value. Only the owner or root may do it.
func (s *Service) SetLayout(ctx context.Context, req *weftv1.SetLayoutRequest) (*weftv1.SetLayoutResponse, error) {
	c := callerOf(req.Caller)
	if req.Layout == nil {
		return nil, fserr.Wrap(syscall.EINVAL, "set layout of inode %d: no layout given", req.Ino)
	}
	// Work out the new layout in a snapshot; placing a file's chains calls
	// the cluster manager, which must not run inside a transaction.
	var want *weftv1.Layout
	var file bool
	err := s.view(ctx, func(x *tx) error {
		a, err := x.inode(req.Ino, "set layout")
		if err != nil {
			return err
		}
		if err := checkLayoutTarget(c, a); err != nil {
			return err
		}
		file = isReg(a.Mode)
		if file {
			want = proto.Clone(a.Layout).(*weftv1.Layout)
		} else if want, err = x.effectiveLayout(a.Ino, s.cfg.DefaultLayout); err != nil {
			return err
		}
		want.Chains = nil
		mergeLayout(want, req.Layout)
		return validateLayout(want)
	})
	if err != nil {
		return nil, err
	}
	// Replicated chains of the asked width are made on first use.
	if err := s.cluster.EnsureChains(ctx, want.Replicas); err != nil {
		return nil, err
	}
	if file {
		if want, err = s.placeLayout(ctx, want); err != nil {
			return nil, err
		}
	}
	err = s.update(ctx, func(x *tx) error {
		a, err := x.inode(req.Ino, "set layout")
		if err != nil {
			return err
		}
		if err := checkLayoutTarget(c, a); err != nil {
			return err
		}
		a.CtimeNs = x.now
		if file {
			a.Layout = want
			return x.putInode(a)
		}
		v, err := proto.Marshal(want)
		if err != nil {
			return err
		}
		if err := x.t.Set(layoutKey(a.Ino), v); err != nil {
			return err
		}
		if err := x.bumpLayoutGen(); err != nil {
			return err
		}
		return x.putInode(a)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.SetLayoutResponse{Layout: want}, nil
}

// checkLayoutTarget allows setting the layout of a directory or of an
// empty regular file, by its owner or root.
func checkLayoutTarget(c caller, a *weftv1.Attr) error {
	if !c.Root() && !c.Owns(a) {
		return fserr.Wrap(syscall.EPERM, "set layout of inode %d: only its owner (uid %d) or root may change it", a.Ino, a.Uid)
	}
	switch {
	case isDir(a.Mode):
		return nil
	case !isReg(a.Mode):
		return fserr.Wrap(syscall.EINVAL, "set layout of inode %d: only regular files and directories have a layout", a.Ino)
	case a.Size > 0:
		return fserr.Wrap(syscall.ENOTEMPTY, "set layout of file %d: the file already holds %d bytes; a layout can only be set on an empty file (copy the data into a new file instead)", a.Ino, a.Size)
	}
	return nil
}
