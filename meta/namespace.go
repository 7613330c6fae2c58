package meta

import (
	"context"
	"fmt"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// ReadDir page sizes.
const (
	defaultReadDirLimit = 1024
	maxReadDirLimit     = 8192
)

// maxLinks is the most names a non-directory may have (as ext4).
const maxLinks = 65000

// Lookup finds name in directory parent. "." is the directory itself and
// ".." its parent.
func (s *Service) Lookup(ctx context.Context, req *weftv1.LookupRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	if err := checkName("lookup", req.Parent, req.Name); err != nil {
		return nil, err
	}
	var a *weftv1.Attr
	err := s.view(ctx, func(x *tx) error {
		op := fmt.Sprintf("lookup %q in directory %d", req.Name, req.Parent)
		d, err := x.dir(req.Parent, op)
		if err != nil {
			return err
		}
		if err := c.Check(d, mayExec, op); err != nil {
			return err
		}
		var ino uint64
		switch req.Name {
		case ".":
			ino = d.Ino
		case "..":
			if ino, err = x.parentOf(d.Ino); err != nil {
				return err
			}
		default:
			var ok bool
			if ino, _, ok, err = x.entry(d.Ino, req.Name); err != nil {
				return err
			} else if !ok {
				return fserr.Wrap(syscall.ENOENT, "%s: no such file or directory", op)
			}
		}
		a, err = x.inode(ino, op)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a}, nil
}

// GetAttr returns the attributes of inode ino (also of an orphan: an
// unlinked file still open somewhere).
func (s *Service) GetAttr(ctx context.Context, req *weftv1.GetAttrRequest) (*weftv1.AttrResponse, error) {
	var a *weftv1.Attr
	err := s.view(ctx, func(x *tx) error {
		var err error
		a, err = x.inode(req.Ino, "getattr")
		return err
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a}, nil
}

// Mkdir makes directory name in parent.
func (s *Service) Mkdir(ctx context.Context, req *weftv1.MkdirRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("mkdir %q in directory %d", req.Name, req.Parent)
	if err := checkName("mkdir", req.Parent, req.Name); err != nil {
		return nil, err
	}
	ino, err := s.takeIno(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	var a, parent *weftv1.Attr
	err = s.update(ctx, func(x *tx) error {
		d, err := x.dirForNewName(c, req.Parent, req.Name, op)
		if err != nil {
			return err
		}
		if a, err = x.newInode(c, d, syscall.S_IFDIR|req.Mode&0o1777, ino); err != nil {
			return err
		}
		a.Nlink = 2
		d.Nlink++
		if err := x.addChild(d, req.Name, a); err != nil {
			return err
		}
		parent = d
		if err := x.t.Set(parentKey(a.Ino), be64(d.Ino)); err != nil {
			return err
		}
		return x.countInode(true, a.Ino, 1)
	})
	if err != nil {
		return nil, err
	}
	resp := &weftv1.AttrResponse{Attr: a, Parent: parent}
	if req.Delegate {
		resp.Delegation = s.grantNewDir(ctx, req, a)
	}
	return resp, nil
}

// dirForNewName returns directory parent for adding name to it: the
// caller needs search permission, the name must be free, and then the
// caller needs write permission (the order Linux checks in).
func (x *tx) dirForNewName(c caller, parent uint64, name, op string) (*weftv1.Attr, error) {
	d, err := x.dir(parent, op)
	if err != nil {
		return nil, err
	}
	if err := c.Check(d, mayExec, op); err != nil {
		return nil, err
	}
	if err := x.mustNotExist(d.Ino, name, op); err != nil {
		return nil, err
	}
	if err := c.Check(d, mayWrite, op); err != nil {
		return nil, err
	}
	return d, nil
}

// mustNotExist returns EEXIST if name ("." and ".." included) exists in
// directory dir.
func (x *tx) mustNotExist(dir uint64, name, op string) error {
	if isDot(name) {
		return fserr.Wrap(syscall.EEXIST, "%s: file exists", op)
	}
	_, _, ok, err := x.entry(dir, name)
	if err != nil {
		return err
	}
	if ok {
		return fserr.Wrap(syscall.EEXIST, "%s: file exists", op)
	}
	return nil
}

// Symlink makes a symbolic link name in parent pointing to target.
func (s *Service) Symlink(ctx context.Context, req *weftv1.SymlinkRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("symlink %q in directory %d", req.Name, req.Parent)
	if err := checkName("symlink", req.Parent, req.Name); err != nil {
		return nil, err
	}
	switch {
	case req.Target == "":
		return nil, fserr.Wrap(syscall.ENOENT, "%s: empty link target", op)
	case len(req.Target) > maxSymlinkBytes:
		return nil, fserr.Wrap(syscall.ENAMETOOLONG, "%s: link target of %d bytes is longer than %d", op, len(req.Target), maxSymlinkBytes)
	}
	ino, err := s.takeIno(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	var a, parent *weftv1.Attr
	err = s.update(ctx, func(x *tx) error {
		d, err := x.dirForNewName(c, req.Parent, req.Name, op)
		if err != nil {
			return err
		}
		if a, err = x.newInode(c, d, syscall.S_IFLNK|0o777, ino); err != nil {
			return err
		}
		a.Size = uint64(len(req.Target))
		if err := x.t.Set(symlinkKey(a.Ino), []byte(req.Target)); err != nil {
			return err
		}
		if err := x.addChild(d, req.Name, a); err != nil {
			return err
		}
		parent = d
		return x.countInode(false, a.Ino, 1)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a, Parent: parent}, nil
}

// Readlink returns a symbolic link's target.
func (s *Service) Readlink(ctx context.Context, req *weftv1.ReadlinkRequest) (*weftv1.ReadlinkResponse, error) {
	var target string
	err := s.view(ctx, func(x *tx) error {
		a, err := x.inode(req.Ino, "readlink")
		if err != nil {
			return err
		}
		if !isLink(a.Mode) {
			return fserr.Wrap(syscall.EINVAL, "readlink of inode %d: not a symbolic link", a.Ino)
		}
		v, ok, err := x.t.Get(symlinkKey(a.Ino))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("readlink of inode %d: target record missing: %w", a.Ino, syscall.EIO)
		}
		target = string(v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.ReadlinkResponse{Target: target}, nil
}

// Link gives inode ino another name, new_name in new_parent.
func (s *Service) Link(ctx context.Context, req *weftv1.LinkRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("link inode %d as %q in directory %d", req.Ino, req.NewName, req.NewParent)
	if err := checkName("link", req.NewParent, req.NewName); err != nil {
		return nil, err
	}
	var a, parent *weftv1.Attr
	err := s.update(ctx, func(x *tx) error {
		var err error
		if a, err = x.inode(req.Ino, op); err != nil {
			return err
		}
		switch {
		case isDir(a.Mode):
			return fserr.Wrap(syscall.EPERM, "%s: hard links to directories are not allowed", op)
		case a.Nlink == 0:
			return fserr.Wrap(syscall.ENOENT, "%s: the file was deleted", op)
		case a.Nlink >= maxLinks:
			return fserr.Wrap(syscall.EMLINK, "%s: the file already has %d links", op, a.Nlink)
		}
		d, err := x.dirForNewName(c, req.NewParent, req.NewName, op)
		if err != nil {
			return err
		}
		a.Nlink++
		a.CtimeNs = x.now
		parent = d
		return x.addChild(d, req.NewName, a)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a, Parent: parent}, nil
}

// ReadDir lists a directory in name order after start_after, without "."
// and "..".
func (s *Service) ReadDir(ctx context.Context, req *weftv1.ReadDirRequest) (*weftv1.ReadDirResponse, error) {
	c := callerOf(req.Caller)
	limit := int(req.Limit)
	if limit <= 0 {
		limit = defaultReadDirLimit
	}
	limit = min(limit, maxReadDirLimit)
	resp := new(weftv1.ReadDirResponse)
	err := s.view(ctx, func(x *tx) error {
		op := fmt.Sprintf("readdir of directory %d", req.Ino)
		d, err := x.dir(req.Ino, op)
		if err != nil {
			return err
		}
		if err := c.Check(d, mayRead, op); err != nil {
			return err
		}
		prefix := dentryPrefix(d.Ino)
		start := prefix
		if req.StartAfter != "" {
			start = append(dentryKey(d.Ino, req.StartAfter), 0)
		}
		err = x.t.Scan(start, kv.PrefixEnd(prefix), func(k, v []byte) (bool, error) {
			if len(resp.Entries) == limit {
				resp.More = true
				return false, nil
			}
			ino, typ, err := decodeDentry(v)
			if err != nil {
				return false, fmt.Errorf("%s: %w", op, err)
			}
			resp.Entries = append(resp.Entries, &weftv1.DirEntry{Name: string(k[len(prefix):]), Ino: ino, Type: typ})
			return true, nil
		})
		if err != nil || !req.Plus {
			return err
		}
		inos := make([]uint64, len(resp.Entries))
		for i, e := range resp.Entries {
			inos[i] = e.Ino
		}
		attrs, err := x.inodes(inos, op)
		if err != nil {
			return err
		}
		for i, e := range resp.Entries {
			e.Attr = attrs[i]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
