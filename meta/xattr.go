package meta

import (
	"context"
	"fmt"
	"strings"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Extended attribute limits (as Linux's XATTR_NAME_MAX and XATTR_SIZE_MAX).
const (
	maxXattrNameBytes  = 255
	maxXattrValueBytes = 64 << 10
)

// Xattr flags.
const (
	xattrCreate  = uint32(weftv1.XattrFlags_XATTR_CREATE)
	xattrReplace = uint32(weftv1.XattrFlags_XATTR_REPLACE)
)

// checkXattr applies Linux's namespace rules for reading (write false) or
// changing (write true) extended attribute name of a:
//   - user.*: regular files and directories only (EPERM on writes to
//     others, ENODATA on reads), with read or write permission on the file;
//   - trusted.*: root only (EPERM on writes, ENODATA on reads);
//   - security.*: anyone reads, root writes;
//   - any other namespace: EOPNOTSUPP.
func checkXattr(c caller, a *weftv1.Attr, name string, write bool, op string) error {
	if name == "" || len(name) > maxXattrNameBytes {
		return fserr.Wrap(syscall.ERANGE, "%s: attribute name must be 1 to %d bytes, got %d", op, maxXattrNameBytes, len(name))
	}
	denied := func(why string) error {
		if write {
			return fserr.Wrap(syscall.EPERM, "%s: %s", op, why)
		}
		return fserr.Wrap(syscall.ENODATA, "%s: no such attribute (%s)", op, why)
	}
	switch {
	case strings.HasPrefix(name, "user."):
		if !isReg(a.Mode) && !isDir(a.Mode) {
			return denied("user.* attributes exist only on regular files and directories")
		}
		if write {
			return c.Check(a, mayWrite, op)
		}
		return c.Check(a, mayRead, op)
	case strings.HasPrefix(name, "trusted."):
		if !c.Root() {
			return denied("trusted.* attributes are for root only")
		}
	case strings.HasPrefix(name, "security."):
		if write && !c.Root() {
			return denied("only root may set security.* attributes")
		}
	default:
		return fserr.Wrap(syscall.EOPNOTSUPP, "%s: unsupported attribute namespace (use user., trusted. or security.)", op)
	}
	return nil
}

// GetXattr returns the value of an extended attribute; ENODATA if absent.
func (s *Service) GetXattr(ctx context.Context, req *weftv1.GetXattrRequest) (*weftv1.GetXattrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("getxattr %q of inode %d", req.Name, req.Ino)
	var value []byte
	err := s.view(ctx, func(x *tx) error {
		a, err := x.inode(req.Ino, op)
		if err != nil {
			return err
		}
		if err := checkXattr(c, a, req.Name, false, op); err != nil {
			return err
		}
		v, ok, err := x.t.Get(xattrKey(a.Ino, req.Name))
		if err != nil {
			return err
		}
		if !ok {
			return fserr.Wrap(syscall.ENODATA, "%s: no such attribute", op)
		}
		value = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.GetXattrResponse{Value: value}, nil
}

// SetXattr sets an extended attribute; XATTR_CREATE fails with EEXIST if it
// exists, XATTR_REPLACE with ENODATA if it does not.
func (s *Service) SetXattr(ctx context.Context, req *weftv1.SetXattrRequest) (*weftv1.SetXattrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("setxattr %q of inode %d", req.Name, req.Ino)
	if len(req.Value) > maxXattrValueBytes {
		return nil, fserr.Wrap(syscall.E2BIG, "%s: value of %d bytes is larger than %d", op, len(req.Value), maxXattrValueBytes)
	}
	if req.Flags&^(xattrCreate|xattrReplace) != 0 || req.Flags == xattrCreate|xattrReplace {
		return nil, fserr.Wrap(syscall.EINVAL, "%s: invalid flags %#x", op, req.Flags)
	}
	err := s.mutateXattr(ctx, c, req.Ino, req.Name, op, func(x *tx, k []byte, exists bool) error {
		switch {
		case exists && req.Flags&xattrCreate != 0:
			return fserr.Wrap(syscall.EEXIST, "%s: attribute exists", op)
		case !exists && req.Flags&xattrReplace != 0:
			return fserr.Wrap(syscall.ENODATA, "%s: no such attribute to replace", op)
		}
		return x.t.Set(k, append([]byte{}, req.Value...))
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.SetXattrResponse{}, nil
}

// ListXattr lists the names of a file's extended attributes that the
// caller may see (trusted.* only for root).
func (s *Service) ListXattr(ctx context.Context, req *weftv1.ListXattrRequest) (*weftv1.ListXattrResponse, error) {
	c := callerOf(req.Caller)
	resp := new(weftv1.ListXattrResponse)
	err := s.view(ctx, func(x *tx) error {
		a, err := x.inode(req.Ino, "listxattr")
		if err != nil {
			return err
		}
		prefix := xattrPrefix(a.Ino)
		return x.t.Scan(prefix, kv.PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
			name := string(k[len(prefix):])
			if c.Root() || !strings.HasPrefix(name, "trusted.") {
				resp.Names = append(resp.Names, name)
			}
			return true, nil
		})
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// RemoveXattr removes an extended attribute; ENODATA if absent.
func (s *Service) RemoveXattr(ctx context.Context, req *weftv1.RemoveXattrRequest) (*weftv1.RemoveXattrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("removexattr %q of inode %d", req.Name, req.Ino)
	err := s.mutateXattr(ctx, c, req.Ino, req.Name, op, func(x *tx, k []byte, exists bool) error {
		if !exists {
			return fserr.Wrap(syscall.ENODATA, "%s: no such attribute", op)
		}
		return x.t.Delete(k)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.RemoveXattrResponse{}, nil
}

// mutateXattr runs change on extended attribute name of inode ino in one
// transaction, after the caller's permission check, and updates the
// inode's ctime when change succeeds. change gets the attribute's key and
// whether it exists.
func (s *Service) mutateXattr(ctx context.Context, c caller, ino uint64, name, op string,
	change func(x *tx, k []byte, exists bool) error) error {
	return s.update(ctx, func(x *tx) error {
		a, err := x.inode(ino, op)
		if err != nil {
			return err
		}
		if err := checkXattr(c, a, name, true, op); err != nil {
			return err
		}
		k := xattrKey(a.Ino, name)
		_, exists, err := x.t.Get(k)
		if err != nil {
			return err
		}
		if err := change(x, k, exists); err != nil {
			return err
		}
		a.CtimeNs = x.now
		return x.putInode(a)
	})
}
