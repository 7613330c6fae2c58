package meta

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Lazy opens and their replay.
//
// An open records itself in the session (open.go) so that unlinking the
// file keeps its data until the last close. Most opens change nothing
// else, and syncing the engine's log for each one was most of the time a
// cold open of a small file took on a disk. With an engine that commits
// lazily (kv.LazyCommitter: the embedded pebble) an open's record is
// committed without a sync and becomes durable with the next change that
// syncs; a crash of the meta server may lose the latest ones, as Lustre's
// metadata server loses the opens its clients then replay:
//
//   - every incarnation of the service has an epoch, a random name sent
//     in the session answers; a client that sees it change (or that has
//     to open a new session) sends the files it has open, with counts, in
//     its next renewal (RenewSessionRequest.reopen), and the service
//     raises each open record to at least that count;
//   - for a grace period after start-up (Config.OpenGrace, by default one
//     and a half session leases: every live client renews in a third of
//     one, and start-up extends every session by a whole lease) a file
//     that loses its last name or its last known open is kept as an
//     orphan even when no session is known to have it open; when the
//     period ends, the orphans still nobody has open are deleted.
//
// Everything else that changes the namespace is synced as before.

// errNeedsSync fails a lazy transaction that would delete a file: it is
// run again synced.
var errNeedsSync = errors.New("meta: transaction must be synced")

// defaultGraceLeases is Config.OpenGrace's default in session leases.
const defaultGraceLeases = 1.5

// sweepBatch is how many orphans one transaction of the sweep checks.
const sweepBatch = 256

// startGrace turns lazy opens on when the engine commits lazily and the
// configuration allows it, and names the incarnation. The grace period
// starts unless the service's data is new (fresh) or the last
// incarnation stopped cleanly (its Close synced every open record and
// left keyCleanStop) after a grace period that ended with its sweep: only
// a crash loses opens, but the orphans kept during a grace period are
// deleted only by its sweep, so a clean stop before the sweep leaves
// keyGrace behind and the next start has a grace period and a sweep too.
// (Its clients replay their opens again, to the new epoch, so the period
// is a whole one.)
func (s *Service) startGrace(ctx context.Context, fresh bool) error {
	lc, ok := s.eng.(kv.LazyCommitter)
	if !ok || !lc.LazyCommits() {
		return nil
	}
	var b [8]byte
	if s.cfg.OpenGrace >= 0 {
		if _, err := rand.Read(b[:]); err != nil {
			return nil // opens stay synced
		}
	}
	clean, pending := false, false
	err := s.eng.Update(ctx, func(t kv.Txn) error {
		var err error
		if _, clean, err = t.Get(keyCleanStop); err != nil {
			return err
		}
		if _, pending, err = t.Get(keyGrace); err != nil {
			return err
		}
		if clean {
			if err := t.Delete(keyCleanStop); err != nil {
				return err
			}
		}
		if fresh || (clean && !pending) || s.cfg.OpenGrace < 0 {
			return nil
		}
		return t.Set(keyGrace, nil)
	})
	if err != nil {
		return fmt.Errorf("read how the last meta service stopped: %w", err)
	}
	if s.cfg.OpenGrace < 0 {
		if pending {
			// Opens are synced now, but orphans kept by an earlier
			// grace period wait for their sweep: it runs at once.
			s.graceUntil = s.now().UnixNano()
		}
		return nil
	}
	s.epoch = hex.EncodeToString(b[:])
	if fresh || (clean && !pending) {
		return nil
	}
	grace := s.cfg.OpenGrace
	if grace == 0 {
		grace = time.Duration(defaultGraceLeases * float64(s.cfg.SessionLease))
	}
	s.graceUntil = s.now().Add(grace).UnixNano()
	if clean {
		s.log.Warn("the last meta service stopped during a grace period, before deleting the files kept in it: files unlinked or closed in the next while are kept until clients have replayed their opens, then the kept ones nobody has open are deleted",
			"grace", grace)
		return nil
	}
	s.log.Warn("the meta service did not stop cleanly: files unlinked or closed in the next while are kept until clients have replayed their opens",
		"grace", grace)
	return nil
}

// noteCleanStop records, in a synced commit that also makes every lazy
// open record before it durable, that this incarnation stops cleanly: the
// next start needs no grace period. Errors are logged (the next start
// then waits out a grace period).
func (s *Service) noteCleanStop() {
	if s.epoch == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.eng.Update(ctx, func(t kv.Txn) error { return t.Set(keyCleanStop, nil) }); err != nil {
		s.log.Warn("could not record a clean stop; the next start keeps unlinked files for a grace period", "err", err)
	}
}

// graceLoop waits for the grace period to end, then deletes the orphans
// nobody has open.
func (s *Service) graceLoop(ctx context.Context) {
	if s.graceUntil == 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Until(time.Unix(0, s.graceUntil))):
	}
	for {
		n, err := s.sweepOrphans(ctx)
		if err == nil {
			if n > 0 {
				s.log.Info("grace period over: deleted files unlinked or closed during it that no client has open", "files", n)
			}
			err = s.eng.Update(ctx, func(t kv.Txn) error { return t.Delete(keyGrace) })
		}
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Error("delete orphans after the grace period (retrying in 10s)", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
		}
	}
}

// sweepOrphans deletes every orphan no session has open, in batches;
// it returns how many it deleted.
func (s *Service) sweepOrphans(ctx context.Context) (int, error) {
	from, deleted := prefixOrphan, 0
	for {
		var inos []uint64
		err := s.view(ctx, func(x *tx) error {
			inos = inos[:0]
			return x.t.Scan(from, kv.PrefixEnd(prefixOrphan), func(k, _ []byte) (bool, error) {
				if len(k) == len(prefixOrphan)+8 {
					inos = append(inos, binary.BigEndian.Uint64(k[len(prefixOrphan):]))
				}
				return len(inos) < sweepBatch, nil
			})
		})
		if err != nil || len(inos) == 0 {
			return deleted, err
		}
		err = s.update(ctx, func(x *tx) error {
			n := 0
			for _, ino := range inos {
				removed, err := x.removeIfUnused(ino)
				if err != nil {
					return err
				}
				if removed {
					n++
				}
			}
			deleted += n
			return nil
		})
		if err != nil {
			return deleted, fmt.Errorf("delete orphans: %w", err)
		}
		if len(inos) < sweepBatch {
			return deleted, nil
		}
		from = append(orphanKey(inos[len(inos)-1]), 0)
	}
}

// removeIfUnused deletes ino if it is still an orphan without a name
// and no session has it open.
func (x *tx) removeIfUnused(ino uint64) (bool, error) {
	_, orphan, err := x.t.Get(orphanKey(ino))
	if err != nil || !orphan {
		return false, err
	}
	if open, err := x.isOpen(ino); err != nil || open {
		return false, err
	}
	a, err := x.inode(ino, "delete orphan")
	if errors.Is(err, syscall.ENOENT) {
		return false, x.t.Delete(orphanKey(ino)) // a stray record
	}
	if err != nil || a.Nlink > 0 {
		return false, err
	}
	return true, x.removeInode(a)
}

// reopen makes session's open records what a client replays: the
// complete list of the files it has open in the session, with counts
// (releases it has queued included). Each listed file's record is set to
// its count; the session's records of files not listed are dropped as a
// release would (a release a crash lost). Files that no longer exist are
// skipped (they were deleted before the client said it has them open:
// nothing is left to keep).
func (x *tx) reopen(session string, opens []*weftv1.OpenCount) error {
	listed := make(map[uint64]bool, len(opens))
	for _, o := range opens {
		if o.GetCount() > 0 {
			listed[o.Ino] = true
		}
	}
	var stale []uint64
	prefix := sessionOpensPrefix(session)
	err := x.t.Scan(prefix, kv.PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
		ino, err := inoFromKeySuffix(k)
		if err == nil && !listed[ino] {
			stale = append(stale, ino)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, ino := range stale {
		if err := x.dropOpen(session, ino); err != nil {
			return err
		}
	}
	for _, o := range opens {
		if o.GetCount() == 0 {
			continue
		}
		if _, ok, err := x.t.Get(inodeKey(o.Ino)); err != nil || !ok {
			if err != nil {
				return err
			}
			continue
		}
		if err := x.t.Set(openKey(o.Ino, session), be64(uint64(o.Count))); err != nil {
			return err
		}
		if err := x.t.Set(sessionOpenKey(session, o.Ino), nil); err != nil {
			return err
		}
	}
	return nil
}
