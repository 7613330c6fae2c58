package meta

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/wire"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Create delegations (README.md "Create delegations"). A client that
// makes many files in one directory asks for the directory (Delegate);
// while it holds it, it answers creates there itself, with inode numbers
// reserved for it, and sends the new files in CreateMany calls, many per
// transaction: before an fsync of one, or the close of one written or
// read, returns, and within milliseconds otherwise. Any call of
// another session that reads or changes the directory first recalls the
// delegation: the holder is told on its callback stream, sends what it
// made, records the opens it still holds and returns the directory; the
// call then runs. A holder that does not return it within recallWait
// loses it, and whatever it sends later is checked like any create.
//
// Delegations live in this meta server's memory, so they are granted
// only where it is the only one (the embedded engine); a restart drops
// them, and the clients' callback streams, restarting with
// Invalidation.all, make them stop creating on their own.

// Delegation limits.
const (
	// delegationInos is how many inode numbers a grant reserves.
	delegationInos = 4096
	// recallWait is how long a call waits for a recalled delegation.
	recallWait = 5 * time.Second
	// maxCreateMany bounds the files of one CreateMany.
	maxCreateMany = 1024
	// delegationLayouts is how many layouts a grant places for the new
	// files (given out in turn).
	delegationLayouts = 16
)

// delegation is one directory delegated to a session.
type delegation struct {
	session string
	gen     uint64
	gone    chan struct{} // closed when returned or revoked
	recall  bool          // the holder was asked to return it
}

// delegations are the create delegations this meta server granted.
type delegations struct {
	mu    sync.Mutex
	gen   uint64
	byDir map[uint64]*delegation
	n     atomic.Int64 // len(byDir), read without the lock

	granted, recalled, revoked atomic.Uint64 // counters for status and tests

	// ranges are the inode numbers reserved for delegations, kept while
	// their session lives and pendingKeep after: files made under them
	// may have data on the data servers before the meta service has
	// them, which fsck must not take for garbage. Ranges of an earlier
	// start are not known: what fsck collects of those marks the numbers
	// dead (n/dead/), and such a file is refused when it comes.
	ranges []inoRange
}

// inoRange is inode numbers [first, end) reserved for a session's
// delegation; until is when it stops protecting them (zero: the session
// lives).
type inoRange struct {
	session    string
	first, end uint64
	until      time.Time
}

// pendingKeep is how long after its session ended (or after this server
// started) a delegation's inode range still counts as possibly in use: a
// client retries sending made files for createManyRetryFor (a minute).
const pendingKeep = 2 * time.Minute

// reserve records a range reserved for session's delegation.
func (ds *delegations) reserve(session string, first, n uint64) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	now := time.Now()
	ds.ranges = slices.DeleteFunc(ds.ranges, func(r inoRange) bool { return !r.until.IsZero() && now.After(r.until) })
	ds.ranges = append(ds.ranges, inoRange{session: session, first: first, end: first + n})
}

// mayBePending reports whether chunks of inode ino, which the meta service
// does not have, may belong to a file a client made under a delegation and
// has not sent yet (its data goes to the data servers first).
func (ds *delegations) mayBePending(ino uint64) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	now := time.Now()
	for _, r := range ds.ranges {
		if ino >= r.first && ino < r.end && (r.until.IsZero() || now.Before(r.until)) {
			return true
		}
	}
	return false
}

// dropLocked forgets d, the delegation of dir, waking whoever waits.
func (ds *delegations) dropLocked(dir uint64, d *delegation) {
	if ds.byDir[dir] == d {
		delete(ds.byDir, dir)
		ds.n.Add(-1)
		close(d.gone)
	}
}

// dropSession forgets every delegation of session (its end).
func (ds *delegations) dropSession(session string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for i := range ds.ranges {
		if r := &ds.ranges[i]; r.session == session && r.until.IsZero() {
			r.until = time.Now().Add(pendingKeep)
		}
	}
	for dir, d := range ds.byDir {
		if d.session == session {
			ds.dropLocked(dir, d)
		}
	}
}

// holder returns the session holding dir's delegation ("" if none).
func (ds *delegations) holder(dir uint64) string {
	if ds.n.Load() == 0 {
		return ""
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if d := ds.byDir[dir]; d != nil {
		return d.session
	}
	return ""
}

// Delegate grants the caller's session a create delegation on a
// directory, if nobody else holds it and this meta server is the only
// one.
func (s *Service) Delegate(ctx context.Context, req *weftv1.DelegateRequest) (*weftv1.DelegateResponse, error) {
	sess := req.GetCaller().GetSession()
	if sess == "" {
		return nil, status.Error(codes.InvalidArgument, "delegate: the caller has no session; mount clients have one")
	}
	if _, several := s.eng.(kv.Watcher); several {
		return &weftv1.DelegateResponse{}, nil
	}
	c := callerOf(req.Caller)
	op := fmt.Sprintf("delegate directory %d", req.Dir)
	var d *weftv1.Attr
	var template *weftv1.Layout
	err := s.view(ctx, func(x *tx) error {
		var err error
		if d, err = x.dir(req.Dir, op); err != nil {
			return err
		}
		if err := c.Check(d, mayWrite|mayExec, op); err != nil {
			return err
		}
		if _, err = x.session(sess, op); err != nil {
			return err
		}
		template, err = x.effectiveLayout(req.Dir, s.cfg.DefaultLayout)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.grant(ctx, sess, d, template, !req.NoInos, op)
}

// grant gives session the delegation of directory d (whose checks
// passed), with new files' layouts from template and, if inos, a range of
// inode numbers; an empty answer if another session holds it.
func (s *Service) grant(ctx context.Context, sess string, d *weftv1.Attr, template *weftv1.Layout, inos bool, op string) (*weftv1.DelegateResponse, error) {
	ds := &s.deleg
	ds.mu.Lock()
	if cur := ds.byDir[d.Ino]; cur != nil && (cur.session != sess || cur.recall) {
		ds.mu.Unlock()
		return &weftv1.DelegateResponse{}, nil
	}
	ds.mu.Unlock()
	var first, count uint64
	if inos {
		var err error
		if first, err = s.reserveInos(ctx, delegationInos); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		count = delegationInos
		s.deleg.reserve(sess, first, count)
	}
	layouts := s.delegationLayouts(ctx, template)
	ds.mu.Lock()
	defer ds.mu.Unlock()
	cur := ds.byDir[d.Ino]
	switch {
	case cur == nil:
		if ds.byDir == nil {
			ds.byDir = make(map[uint64]*delegation)
		}
		ds.gen++
		cur = &delegation{session: sess, gen: ds.gen, gone: make(chan struct{})}
		ds.byDir[d.Ino] = cur
		ds.n.Add(1)
		ds.granted.Add(1)
	case cur.session != sess || cur.recall:
		return &weftv1.DelegateResponse{}, nil // taken meanwhile
	}
	return &weftv1.DelegateResponse{Granted: true, Generation: cur.gen, InoFirst: first,
		InoCount: count, Dir: d, Layouts: layouts}, nil
}

// grantNewDir answers Mkdir's delegate: the delegation of the directory it
// just made, if this meta server grants delegations; nil if not, or if it
// cannot now (the mkdir stands either way).
func (s *Service) grantNewDir(ctx context.Context, req *weftv1.MkdirRequest, d *weftv1.Attr) *weftv1.DelegateResponse {
	sess := req.GetCaller().GetSession()
	if _, several := s.eng.(kv.Watcher); several || sess == "" {
		return nil
	}
	op := fmt.Sprintf("delegate new directory %d", d.Ino)
	var template *weftv1.Layout
	err := s.view(ctx, func(x *tx) error {
		if _, err := x.session(sess, op); err != nil {
			return err
		}
		var err error
		template, err = x.effectiveLayout(d.Ino, s.cfg.DefaultLayout)
		return err
	})
	var g *weftv1.DelegateResponse
	if err == nil {
		g, err = s.grant(ctx, sess, d, template, !req.NoInos, op)
	}
	if err != nil {
		s.log.Debug("no delegation for a new directory", "dir", d.Ino, "err", err)
		return nil
	}
	return g
}

// delegationLayouts places layouts for a grant's new files from the
// directory's template; none if they cannot be placed now (the files then
// get theirs when they reach the meta service).
func (s *Service) delegationLayouts(ctx context.Context, template *weftv1.Layout) []*weftv1.Layout {
	if template == nil {
		return nil
	}
	out := make([]*weftv1.Layout, 0, delegationLayouts)
	for range delegationLayouts {
		l, err := s.placeLayout(ctx, template)
		if err != nil {
			s.log.Debug("no layouts placed for a create delegation", "err", err)
			return nil
		}
		out = append(out, l)
	}
	return out
}

// ReturnDelegation gives a delegation back.
func (s *Service) ReturnDelegation(ctx context.Context, req *weftv1.ReturnDelegationRequest) (*weftv1.ReturnDelegationResponse, error) {
	ds := &s.deleg
	ds.mu.Lock()
	if d := ds.byDir[req.Dir]; d != nil && d.session == req.Session && (req.Generation == 0 || d.gen == req.Generation) {
		ds.dropLocked(req.Dir, d)
	}
	ds.mu.Unlock()
	return &weftv1.ReturnDelegationResponse{}, nil
}

// reserveInos reserves n inode numbers in n/next, for this server's own
// range or a delegation's, and returns the first.
func (s *Service) reserveInos(ctx context.Context, n uint64) (uint64, error) {
	var lo uint64
	err := s.eng.Update(ctx, func(t kv.Txn) error {
		next, err := getUint64(t, keyNextIno)
		if err != nil {
			return fmt.Errorf("read inode counter: %w", err)
		}
		if next <= rootIno {
			return fmt.Errorf("inode counter is %d: metadata not initialized: %w", next, syscall.EIO)
		}
		lo = next
		return t.Set(keyNextIno, be64(next+n))
	})
	if err != nil {
		return 0, fmt.Errorf("reserve inode numbers: %w", err)
	}
	return lo, nil
}

// recallInterceptor makes a call that reads or changes a directory
// delegated to another session wait until the holder returned it (or
// lost it, after recallWait).
func (s *Service) recallInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.deleg.n.Load() == 0 {
		return handler(ctx, req)
	}
	sess := requestSession(req)
	for _, dir := range s.touchedDirs(ctx, info.FullMethod, req) {
		if err := s.recall(ctx, dir, sess); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

// touchedDirs lists the directories whose entries or attributes a call
// reads or changes (dirs and entries in its call option; only asked
// while delegations exist).
func (s *Service) touchedDirs(ctx context.Context, method string, req any) []uint64 {
	call := weftv1.MetaCallOf(method)
	msg := asMessage(req)
	dirs := call.Dirs(msg)
	for _, e := range call.Entries(msg) {
		dirs = append(dirs, s.entryIno(ctx, e.Parent, e.Name)...)
	}
	return dirs
}

// entryIno returns the inode of name in parent if it is a delegated
// directory.
func (s *Service) entryIno(ctx context.Context, parent uint64, name string) []uint64 {
	var ino uint64
	_ = s.view(ctx, func(x *tx) error {
		var err error
		ino, _, _, err = x.entry(parent, name)
		return err
	})
	if ino != 0 && s.deleg.holder(ino) != "" {
		return []uint64{ino}
	}
	return nil
}

// recall waits until dir is not delegated to a session other than sess,
// asking the holder to return it.
func (s *Service) recall(ctx context.Context, dir uint64, sess string) error {
	ds := &s.deleg
	ds.mu.Lock()
	d := ds.byDir[dir]
	if d == nil || d.session == sess {
		ds.mu.Unlock()
		return nil
	}
	if !d.recall {
		d.recall = true
		ds.recalled.Add(1)
		s.cb.recall(d.session, dir, d.gen)
	}
	ds.mu.Unlock()
	wait := s.recallWait
	if wait <= 0 {
		wait = recallWait
	}
	wire.WillBlock(ctx) // a call served inline lets its connection be read meanwhile
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-d.gone:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-t.C:
	}
	ds.mu.Lock()
	if ds.byDir[dir] == d {
		ds.dropLocked(dir, d)
		ds.revoked.Add(1)
		s.log.Warn("a create delegation was not returned in time and is revoked; files its client sends later are checked like any create",
			"dir", dir, "session", d.session, "waited", wait)
	}
	ds.mu.Unlock()
	return nil
}

// RecordOpens records one open by the session of each inode: files it
// made under a delegation and still has open, before anything could
// remove their names. Inodes that are gone are skipped.
func (s *Service) RecordOpens(ctx context.Context, req *weftv1.RecordOpensRequest) (*weftv1.RecordOpensResponse, error) {
	if len(req.Inos) > maxCreateMany {
		return nil, fserr.Wrap(syscall.EINVAL, "record opens: %d inodes in one call, at most %d", len(req.Inos), maxCreateMany)
	}
	err := s.update(ctx, func(x *tx) error {
		for _, ino := range req.Inos {
			if _, ok, err := x.t.Get(inodeKey(ino)); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			if err := x.recordOpen(req.Session, ino, fmt.Sprintf("record the open of inode %d", ino)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.RecordOpensResponse{}, nil
}
