package meta

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/perm"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// The one create. A Create call and a file a client made under a create
// delegation (sent later in a CreateMany, delegate.go) go through the same
// checks and the same transaction step, makeFile: the name, the type, the
// directory's permissions, a free name, the new inode's owner, group and
// mode, the parent's update and the inode count. A delegated create only
// brings what its client chose under the grant: the inode number, the
// layout the grant placed, its time, and the attribute changes and commit
// made to the file before it was sent.

// fileSpec is what one create makes.
type fileSpec struct {
	parent    uint64
	name      string
	mode      uint32 // type and permission bits
	rdev      uint32
	exclusive bool
	openFlags uint32
	session   string         // with Create: the open is recorded for it
	ino       uint64         // 0 while the name existed at the look
	layout    *weftv1.Layout // regular files
	// made is set for a file made by its client under a delegation: its
	// inode number must be one reserved and unused, and its time and
	// the changes made to it before it was sent are applied.
	made *weftv1.NewFile
}

// checkCreate checks what a create may make before anything is looked up
// and returns the file type (a missing type is a regular file).
func checkCreate(c caller, parent uint64, name string, mode uint32, op string) (uint32, error) {
	if err := checkName("create", parent, name); err != nil {
		return 0, err
	}
	if isDot(name) {
		return 0, fserr.Wrap(syscall.EEXIST, "%s: file exists", op)
	}
	switch typ := fileType(mode); typ {
	case 0:
		return syscall.S_IFREG, nil
	case syscall.S_IFREG, syscall.S_IFIFO, syscall.S_IFSOCK:
		return typ, nil
	case syscall.S_IFCHR, syscall.S_IFBLK:
		if !c.Root() {
			return 0, fserr.Wrap(syscall.EPERM, "%s: only root may make device nodes", op)
		}
		return typ, nil
	}
	return 0, fserr.Wrap(syscall.EINVAL, "%s: mode %#o is not a regular file, FIFO, socket or device", op, mode)
}

// makeFile checks and makes n for c in one transaction. Without exclusive
// an existing file is opened instead (created false). Nothing is written
// unless every check passed.
func (x *tx) makeFile(c caller, n fileSpec, op string) (a *weftv1.Attr, created bool, err error) {
	d, err := x.dir(n.parent, op)
	if err != nil {
		return nil, false, err
	}
	if err := c.Check(d, mayExec, op); err != nil {
		return nil, false, err
	}
	ino, _, exists, err := x.entry(d.Ino, n.name)
	if err != nil {
		return nil, false, err
	}
	if exists {
		if n.made != nil && ino == n.ino {
			a, err := x.inode(ino, op) // sent again after the answer was lost
			return a, false, err
		}
		if n.exclusive {
			return nil, false, fserr.Wrap(syscall.EEXIST, "%s: file exists", op)
		}
		a, err := x.openExisting(c, ino, n, op)
		return a, false, err
	}
	if err := c.Check(d, mayWrite, op); err != nil {
		return nil, false, err
	}
	if n.made != nil {
		if err := x.checkMadeIno(n.ino, op); err != nil {
			return nil, false, err
		}
		if n.layout == nil {
			return nil, false, fserr.Wrap(syscall.EIO, "%s: no layout could be placed for the directory", op)
		}
	}
	if (isReg(n.mode) && n.layout == nil) || n.ino == 0 {
		return nil, false, errNeedLayout
	}
	a = perm.NewAttr(c, d, n.mode, n.ino, x.now)
	if isReg(n.mode) {
		a.Layout = n.layout
	} else {
		a.Rdev = n.rdev
	}
	stamp := x.now
	if n.made != nil {
		if t := n.made.TimeNs; t > 0 {
			stamp = t
			a.AtimeNs, a.MtimeNs, a.CtimeNs = t, t, t
		}
		if err := applyMadeChanges(c, a, n.made, op); err != nil {
			return nil, false, err
		}
	}
	if err := x.addChildAt(d, n.name, a, stamp); err != nil {
		return nil, false, err
	}
	if err := x.countInode(false, a.Ino, 1); err != nil {
		return nil, false, err
	}
	if n.made == nil && n.session != "" {
		if err := x.recordNewOpen(n.session, a.Ino, op); err != nil {
			return nil, false, err
		}
	}
	return a, true, nil
}

// openExisting is a non-exclusive create of a name that exists: the file
// is opened, with the open's permission check.
func (x *tx) openExisting(c caller, ino uint64, n fileSpec, op string) (*weftv1.Attr, error) {
	a, err := x.inode(ino, op)
	if err != nil {
		return nil, err
	}
	if isDir(a.Mode) {
		return nil, fserr.Wrap(syscall.EISDIR, "%s: is a directory", op)
	}
	if err := checkOpen(c, a, n.openFlags, op); err != nil {
		return nil, err
	}
	if n.session != "" {
		if err := x.recordOpen(n.session, a.Ino, op); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// checkMadeIno checks that inode number ino, chosen by a client from its
// delegation's range, is free, and that fsck did not collect chunks
// written for it.
func (x *tx) checkMadeIno(ino uint64, op string) error {
	if _, used, err := x.t.Get(inodeKey(ino)); err != nil || used {
		if err == nil {
			err = fserr.Wrap(syscall.EINVAL, "%s: inode number %d is in use", op, ino)
		}
		return err
	}
	for _, key := range [][]byte{gcKey(ino), deadKey(ino)} {
		if _, gone, err := x.t.Get(key); err != nil || gone {
			if err == nil {
				err = fserr.Wrap(syscall.EIO, "%s: the data of inode %d was collected as garbage (fsck --repair) before the file arrived", op, ino)
			}
			return err
		}
	}
	return nil
}

// applyMadeChanges applies to a new file what its client did to it before
// sending it: attribute changes, as SetAttr would have at their times, and
// the commit of its writes (what CommitWrite would store) after the first
// f.CommitAfter of them.
func applyMadeChanges(c caller, a *weftv1.Attr, f *weftv1.NewFile, op string) error {
	if len(f.SetattrTimesNs) != len(f.Setattrs) {
		return fserr.Wrap(syscall.EINVAL, "%s: %d attribute changes with %d times", op, len(f.Setattrs), len(f.SetattrTimesNs))
	}
	apply := func(from, to int) error {
		for i := from; i < to; i++ {
			req := f.Setattrs[i]
			if req.Valid&setSize != 0 {
				return fserr.Wrap(syscall.EINVAL, "%s: a size change cannot come with the create", op)
			}
			if err := perm.ApplySetAttr(callerOf(req.Caller), a, req, f.SetattrTimesNs[i], op+": a change made with it"); err != nil {
				return err
			}
		}
		return nil
	}
	k := min(int(f.CommitAfter), len(f.Setattrs))
	if err := apply(0, k); err != nil {
		return err
	}
	if f.Committed {
		a.Size = f.Size
		if f.MtimeNs > 0 {
			a.MtimeNs = f.MtimeNs
		}
		a.CtimeNs = max(a.CtimeNs, a.MtimeNs)
		if !c.Root() {
			a.Mode = fileType(a.Mode) | killSuid(a.Mode&0o7777)
		}
	}
	return apply(k, len(f.Setattrs))
}

// Create makes a regular file, FIFO, socket or device node, or, without
// exclusive, returns an existing file after checking the open permission.
// With a session the file is also opened for it.
func (s *Service) Create(ctx context.Context, req *weftv1.CreateRequest) (*weftv1.CreateResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("create %q in directory %d", req.Name, req.Parent)
	typ, err := checkCreate(c, req.Parent, req.Name, req.Mode, op)
	if err != nil {
		return nil, err
	}
	n := fileSpec{parent: req.Parent, name: req.Name, mode: typ | req.Mode&0o7777, rdev: req.Rdev,
		exclusive: req.Exclusive, openFlags: req.OpenFlags, session: req.Session}
	if typ == syscall.S_IFREG {
		// The directory's effective layout is cached: place first, and
		// let the transaction check that the layout generation it was
		// cached at still holds (and everything else); no look first.
		if template, gen, ok := s.peekEffectiveLayout(req.Parent); ok {
			if n.ino, err = s.takeIno(ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			if n.layout, err = s.placeLayout(ctx, template); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			resp, err := s.create(ctx, c, n, op, &gen)
			if err != errLayoutChanged {
				return resp, err
			}
		}
	}
	for attempt := 0; ; attempt++ {
		// Placing a new file's chains calls the cluster manager, which
		// must not run inside a transaction: look first, place, then
		// create if the name is still free.
		var template *weftv1.Layout
		exists := false
		err := s.view(ctx, func(x *tx) error {
			d, err := x.dir(req.Parent, op)
			if err != nil {
				return err
			}
			if err := c.Check(d, mayExec, op); err != nil {
				return err
			}
			if _, _, exists, err = x.entry(d.Ino, req.Name); err != nil || exists {
				return err
			}
			if err := c.Check(d, mayWrite, op); err != nil {
				return err
			}
			if typ == syscall.S_IFREG {
				template, err = s.cachedEffectiveLayout(x, d.Ino)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		n.ino, n.layout = 0, nil // none is needed while the name exists
		if !exists {
			if n.ino, err = s.takeIno(ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		if template != nil {
			if n.layout, err = s.placeLayout(ctx, template); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		resp, err := s.create(ctx, c, n, op, nil)
		if err == errNeedLayout && attempt < 3 {
			continue
		}
		return resp, err
	}
}

// errNeedLayout says that a name became free between Create's look and
// its transaction, so a layout must be placed (and an inode number taken)
// first.
var errNeedLayout = fmt.Errorf("create raced with an unlink: %w", kv.ErrConflict)

// errLayoutChanged says that the layout generation a create's layout was
// placed under has moved: the directory's effective layout may differ.
var errLayoutChanged = errors.New("create: the directory's layout may have changed since it was cached")

// create runs a Create's transaction. With layoutGen, n's layout came from
// the cache at that layout generation, which the transaction checks.
func (s *Service) create(ctx context.Context, c caller, n fileSpec, op string, layoutGen *uint64) (*weftv1.CreateResponse, error) {
	resp := new(weftv1.CreateResponse)
	err := s.update(ctx, func(x *tx) error {
		if layoutGen != nil {
			gen, err := getUint64(x.t, keyLayoutGen)
			if err != nil {
				return err
			}
			if gen != *layoutGen {
				return errLayoutChanged
			}
		}
		var err error
		resp.Attr, resp.Created, err = x.makeFile(c, n, op)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// checkGivenLayout checks a layout a client gives a new file (one its
// delegation's grant placed): complete, within weft's limits, and on
// chains that exist with as many members as it has replicas.
func (s *Service) checkGivenLayout(l *weftv1.Layout) error {
	if err := validateLayout(l); err != nil {
		return err
	}
	if len(l.Chains) == 0 || len(l.Chains) != int(l.StripeCount) {
		return fserr.Wrap(syscall.EINVAL, "layout of %d chains for a stripe count of %d", len(l.Chains), l.StripeCount)
	}
	for _, id := range l.Chains {
		w, ok := s.cluster.ChainWidth(id)
		if !ok {
			return fserr.Wrap(syscall.EINVAL, "layout names chain %d, which does not exist", id)
		}
		if w != int(l.Replicas) {
			return fserr.Wrap(syscall.EINVAL, "layout of %d replicas names chain %d of %d members", l.Replicas, id, w)
		}
	}
	return nil
}

// CreateMany stores regular files made under delegations, in one
// transaction. Each is checked like a create (the directory, permissions,
// a free name) and its inode number must be one reserved and unused;
// a file that fails gets its errno and the others are made.
func (s *Service) CreateMany(ctx context.Context, req *weftv1.CreateManyRequest) (*weftv1.CreateManyResponse, error) {
	if req.Session == "" {
		return nil, status.Error(codes.InvalidArgument, "create many: no session")
	}
	if len(req.Files) > maxCreateMany {
		return nil, fserr.Wrap(syscall.EINVAL, "create many: %d files in one call, at most %d", len(req.Files), maxCreateMany)
	}
	for attempt := 0; ; attempt++ {
		// A retry looks the layouts up in a transaction: the cache may
		// hold them at a generation that has moved on since, and would
		// fail every try alike.
		resp, err := s.createMany(ctx, req, attempt == 0)
		if err == errLayoutChanged && attempt < 3 {
			continue
		}
		return resp, err
	}
}

// createMany is one try of CreateMany: the directories' layouts are
// looked up (from the cache if useCache and it holds them all) and placed
// first, and the transaction checks that they still hold.
func (s *Service) createMany(ctx context.Context, req *weftv1.CreateManyRequest, useCache bool) (*weftv1.CreateManyResponse, error) {
	templates := make(map[uint64]*weftv1.Layout)
	var gen uint64
	cached := useCache
	for _, f := range req.Files {
		if !cached {
			break
		}
		if _, ok := templates[f.Parent]; ok {
			continue
		}
		l, g, ok := s.peekEffectiveLayout(f.Parent)
		if !ok || (len(templates) > 0 && g != gen) {
			cached = false
			break
		}
		templates[f.Parent], gen = l, g
	}
	var err error
	if !cached {
		clear(templates)
		err = s.view(ctx, s.lookTemplates(req, templates, &gen))
	}
	if err != nil {
		return nil, err
	}
	layouts := make([]*weftv1.Layout, len(req.Files))
	given := make([]error, len(req.Files))
	for i, f := range req.Files {
		if f.Layout != nil {
			if given[i] = s.checkGivenLayout(f.Layout); given[i] == nil {
				layouts[i] = f.Layout
			}
			continue
		}
		if t := templates[f.Parent]; t != nil {
			if layouts[i], err = s.placeLayout(ctx, t); err != nil {
				return nil, fmt.Errorf("create many: place the layout of %q: %w", f.Name, err)
			}
		}
	}
	s.inos.mu.Lock()
	ownNext, ownEnd := s.inos.next, s.inos.end
	s.inos.mu.Unlock()
	resp := &weftv1.CreateManyResponse{Results: make([]*weftv1.NewFileResult, len(req.Files))}
	err = s.update(ctx, func(x *tx) error {
		g, err := getUint64(x.t, keyLayoutGen)
		if err != nil {
			return err
		}
		if g != gen {
			return errLayoutChanged
		}
		next, err := getUint64(x.t, keyNextIno)
		if err != nil {
			return err
		}
		for i, f := range req.Files {
			reserved := f.Ino > rootIno && f.Ino < next && (f.Ino < ownNext || f.Ino >= ownEnd)
			a, err := x.makeSent(f, layouts[i], given[i], reserved)
			r := &weftv1.NewFileResult{Attr: a}
			if err != nil {
				if errno, ok := fserr.Errno(err); ok {
					r.Errno, r.Error = uint32(errno), err.Error()
				} else {
					return err // the store failed: nothing is made
				}
			}
			resp.Results[i] = r
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// lookTemplates returns a view that reads the layout generation into gen
// and the effective layout of every directory of req into templates (nil
// for one that cannot be read: the transaction reports its files'
// errors).
func (s *Service) lookTemplates(req *weftv1.CreateManyRequest, templates map[uint64]*weftv1.Layout, gen *uint64) func(x *tx) error {
	return func(x *tx) error {
		var err error
		if *gen, err = getUint64(x.t, keyLayoutGen); err != nil {
			return err
		}
		for _, f := range req.Files {
			if _, ok := templates[f.Parent]; ok {
				continue
			}
			l, err := s.cachedEffectiveLayout(x, f.Parent)
			if err != nil {
				l = nil
			}
			templates[f.Parent] = l
		}
		return nil
	}
}

// makeSent makes one file of a CreateMany with makeFile; reserved says
// whether its inode number is one reserved for a delegation (below the
// counter, outside this server's own range), layoutErr what is wrong with
// the layout it brought.
func (x *tx) makeSent(f *weftv1.NewFile, layout *weftv1.Layout, layoutErr error, reserved bool) (*weftv1.Attr, error) {
	c := callerOf(f.Caller)
	op := fmt.Sprintf("create %q in directory %d", f.Name, f.Parent)
	if _, err := checkCreate(c, f.Parent, f.Name, syscall.S_IFREG, op); err != nil {
		return nil, err
	}
	if layoutErr != nil {
		return nil, fserr.Wrap(syscall.EINVAL, "%s: %v", op, layoutErr)
	}
	if !reserved {
		return nil, fserr.Wrap(syscall.EINVAL, "%s: inode number %d was not reserved for a delegation", op, f.Ino)
	}
	a, _, err := x.makeFile(c, fileSpec{parent: f.Parent, name: f.Name, mode: syscall.S_IFREG | f.Mode&0o7777,
		exclusive: true, ino: f.Ino, layout: layout, made: f}, op)
	return a, err
}
