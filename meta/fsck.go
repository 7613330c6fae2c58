package meta

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Kinds of problems fsck reports (FsckProblem.kind).
const (
	fsckDangling      = "dangling_entry"       // entry naming a missing inode
	fsckTypeMismatch  = "type_mismatch"        // entry type differs from the inode's mode
	fsckExtraDirEntry = "extra_dir_entry"      // a second name of a directory
	fsckNlink         = "wrong_nlink"          // link count differs from the entries
	fsckOrphan        = "orphan_inode"         // inode no entry names (and no live open keeps)
	fsckParent        = "bad_parent"           // directory parent record missing or wrong
	fsckCounter       = "wrong_counter"        // n/cnt/files or n/cnt/dirs off
	fsckInoCounter    = "inode_counter_behind" // n/next not above every inode
	fsckStaleGC       = "stale_gc_entry"       // GC queue entry of a live inode
	fsckStaleOpen     = "stale_open"           // open record of an ended session or missing inode
	fsckOrphanRecord  = "bad_orphan_record"    // orphan record of a linked or missing inode
	fsckStaleRecord   = "stale_record"         // symlink/parent/xattr/layout record of a missing inode
	fsckNoTarget      = "symlink_without_target"
	fsckCorrupt       = "corrupt_record" // a record that does not decode
	fsckUnowned       = "unowned_chunk"  // chunk no file owns
	fsckMissing       = "missing_chunk"  // chunk some serving replicas lack
	fsckBadLayout     = "bad_layout"     // a file's layout names a chain that does not exist
	fsckBadCopy       = "corrupt_chunk"  // a copy of a chunk that fails its checksums
	fsckUnchecked     = "chain_not_checked"
)

// fsckMaxListed is how many problems one fsck answer lists; the rest are
// only counted (problems_not_listed).
const fsckMaxListed = 10000

// lostFoundName is the directory at the root that unreachable inodes are
// moved to.
const lostFoundName = "lost+found"

// fsckMu lets one fsck run at a time per meta server.
var fsckMu sync.Mutex

// Fsck checks the namespace and the chunks on the data servers while the
// file system is in use, and with repair fixes what can be fixed safely.
// Every finding of the scan is verified again in a transaction of its own
// against the current state before it is reported or repaired (see
// README.md, "fsck").
func (s *Service) Fsck(ctx context.Context, req *weftv1.FsckRequest) (*weftv1.FsckResponse, error) {
	if !fsckMu.TryLock() {
		return nil, fserr.Wrap(syscall.EBUSY, "fsck: another fsck is running on this meta server: wait for it to finish")
	}
	defer fsckMu.Unlock()
	start := time.Now()
	f := &fscker{s: s, repair: req.Repair, resp: &weftv1.FsckResponse{}}
	s.log.Info("fsck started", "repair", req.Repair)
	if err := f.run(ctx); err != nil {
		s.log.Error("fsck failed", "err", err)
		return nil, fmt.Errorf("fsck: %w", err)
	}
	f.resp.DurationMs = time.Since(start).Milliseconds()
	s.log.Info("fsck done", "problems", len(f.resp.Problems)+int(f.resp.ProblemsNotListed),
		"inodes", f.resp.InodesChecked, "entries", f.resp.EntriesChecked, "chunks", f.resp.ChunksChecked,
		"duration", time.Since(start))
	return f.resp, nil
}

// fscker is one fsck run.
type fscker struct {
	s      *Service
	repair bool
	resp   *weftv1.FsckResponse
	scan   *nsScan
	// lostFound is the lost+found directory once made or found (0: not yet).
	lostFound uint64
}

func (f *fscker) run(ctx context.Context) error {
	sc, err := f.s.scanNamespace(ctx)
	if err != nil {
		return err
	}
	f.scan = sc
	f.resp.InodesChecked, f.resp.EntriesChecked = uint64(len(sc.inodes)), sc.entries
	for _, p := range sc.corrupt {
		f.add(p)
	}
	steps := []func(context.Context) error{
		f.checkCounters,
		f.checkInoCounter,
		f.checkEntries,
		f.checkStaleRecords,
		f.checkGCQueue,
		f.checkOpens,
		f.checkOrphanRecords,
		f.checkNlinks,
		f.checkParents,
		f.checkSymlinks,
		f.checkChunks,
		f.checkBadCopies,
		f.checkUnreachable,
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// add records a problem (or only counts it past the listing limit).
func (f *fscker) add(p *weftv1.FsckProblem) {
	if len(f.resp.Problems) >= fsckMaxListed {
		f.resp.ProblemsNotListed++
		return
	}
	f.resp.Problems = append(f.resp.Problems, p)
}

// verify runs fn as one transaction against the current state: an Update
// when repairing (fn then also writes its fix), a View otherwise. fn
// returns the problem if it still holds, nil if it went away (the
// namespace changed since the scan); verify records it. fn may run more
// than once.
func (f *fscker) verify(ctx context.Context, fn func(x *tx, repair bool) (*weftv1.FsckProblem, error)) error {
	p, err := f.check(ctx, fn)
	if p != nil {
		f.add(p)
	}
	return err
}

// check is verify without recording the problem.
func (f *fscker) check(ctx context.Context, fn func(x *tx, repair bool) (*weftv1.FsckProblem, error)) (*weftv1.FsckProblem, error) {
	var p *weftv1.FsckProblem
	run := func(x *tx) error {
		var err error
		p, err = fn(x, f.repair)
		return err
	}
	var err error
	if f.repair {
		err = f.s.update(ctx, run)
	} else {
		err = f.s.view(ctx, run)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}
