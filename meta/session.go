package meta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// sessionRecord is the value of n/s/<id>.
type sessionRecord struct {
	Host       string `json:"host"`
	MountPoint string `json:"mount_point"`
	Version    string `json:"version"`
	ExpiresNs  int64  `json:"expires_ns"`
	// Closing is set once ending the session began but its opens did not
	// all go in one transaction (see endSession): the session can no
	// longer be renewed or open more files, and expiry finishes ending it.
	Closing bool `json:"closing,omitempty"`
}

// session reads session id; ESTALE if it is unknown, has expired or is
// being closed.
func (x *tx) session(id, op string) (*sessionRecord, error) {
	v, ok, err := x.t.Get(sessionKey(id))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fserr.Wrap(syscall.ESTALE, "%s: session %q is unknown or expired; the client must open a new session", op, id)
	}
	rec, err := decodeSession(id, v)
	if err != nil {
		return nil, fmt.Errorf("%s: corrupt session record %q: %v: %w", op, id, err, syscall.EIO)
	}
	if rec.Closing {
		return nil, fserr.Wrap(syscall.ESTALE, "%s: session %q is being closed; the client must open a new session", op, id)
	}
	return rec, nil
}

// sessionDecoded remembers the last decoded record of each session by its
// bytes: every create and open reads the session record (recordOpen), and
// the same bytes always decode to the same record, so only a changed
// record (renewal, closing) is parsed again.
var sessionDecoded struct {
	sync.Mutex
	m map[string]sessionDecodedEntry
}

type sessionDecodedEntry struct {
	raw string
	rec sessionRecord
}

// maxSessionDecoded bounds sessionDecoded (ended sessions are not removed
// from it one by one; past the bound it starts over).
const maxSessionDecoded = 4096

// decodeSession decodes session record v of session id into a new record
// the caller may change.
func decodeSession(id string, v []byte) (*sessionRecord, error) {
	sessionDecoded.Lock()
	if e, ok := sessionDecoded.m[id]; ok && e.raw == string(v) {
		rec := e.rec
		sessionDecoded.Unlock()
		return &rec, nil
	}
	sessionDecoded.Unlock()
	rec := new(sessionRecord)
	if err := json.Unmarshal(v, rec); err != nil {
		return nil, err
	}
	sessionDecoded.Lock()
	if sessionDecoded.m == nil || len(sessionDecoded.m) >= maxSessionDecoded {
		sessionDecoded.m = make(map[string]sessionDecodedEntry)
	}
	sessionDecoded.m[id] = sessionDecodedEntry{raw: string(v), rec: *rec}
	sessionDecoded.Unlock()
	return rec, nil
}

func (x *tx) putSession(id string, rec *sessionRecord) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return x.t.Set(sessionKey(id), v)
}

// OpenSession starts a client session. It lives for the lease and must be
// renewed before it runs out.
func (s *Service) OpenSession(ctx context.Context, req *weftv1.OpenSessionRequest) (*weftv1.OpenSessionResponse, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("open session: make id: %w", err)
	}
	id := hex.EncodeToString(b[:])
	err := s.update(ctx, func(x *tx) error {
		err := x.putSession(id, &sessionRecord{
			Host: req.Host, MountPoint: req.MountPoint, Version: req.Version,
			ExpiresNs: x.now + s.cfg.SessionLease.Nanoseconds(),
		})
		if err != nil {
			return err
		}
		return x.reopen(id, req.Reopen)
	})
	if err != nil {
		return nil, fmt.Errorf("open session for %s:%s: %w", req.Host, req.MountPoint, err)
	}
	s.log.Info("session opened", "session", id, "host", req.Host, "mount", req.MountPoint)
	if len(req.Reopen) > 0 {
		s.log.Info("files of an earlier session recorded as open in the new one", "session", id, "files", len(req.Reopen))
	}
	return &weftv1.OpenSessionResponse{Session: id, LeaseMs: s.cfg.SessionLease.Milliseconds(), WireAddress: s.wireAddress(), Epoch: s.epoch}, nil
}

// RenewSession extends a session's lease, and records again the opens the
// client replays (replay.go); ESTALE if it already expired.
func (s *Service) RenewSession(ctx context.Context, req *weftv1.RenewSessionRequest) (*weftv1.RenewSessionResponse, error) {
	err := s.update(ctx, func(x *tx) error {
		rec, err := x.session(req.Session, "renew session")
		if err != nil {
			return err
		}
		rec.ExpiresNs = x.now + s.cfg.SessionLease.Nanoseconds()
		if err := x.putSession(req.Session, rec); err != nil {
			return err
		}
		if !req.Replay {
			return nil
		}
		return x.reopen(req.Session, req.Reopen)
	})
	if err != nil {
		return nil, err
	}
	if req.Replay {
		s.log.Info("client replayed its open files", "session", req.Session, "files", len(req.Reopen))
	}
	return &weftv1.RenewSessionResponse{WireAddress: s.wireAddress(), Epoch: s.epoch}, nil
}

// CloseSession ends a session: its opens are dropped (deleting orphans
// nobody else has open). Closing an unknown session is not an error.
func (s *Service) CloseSession(ctx context.Context, req *weftv1.CloseSessionRequest) (*weftv1.CloseSessionResponse, error) {
	if err := s.endSession(ctx, req.Session, false); err != nil {
		return nil, err
	}
	s.log.Info("session closed", "session", req.Session)
	return &weftv1.CloseSessionResponse{}, nil
}

// Batch sizes of the multi-transaction session operations. The etcd engine
// takes at most --max-txn-ops (default 128) compares, and as many writes,
// in one transaction; these keep every transaction below that.
const (
	// endSessionScan is how many of a session's opens one step of
	// endSession looks at.
	endSessionScan = 50
	// txnOpsBudget bounds the estimated compares, and the writes, of one
	// step of endSession.
	txnOpsBudget = 110
	// extendSessionsBatch is how many sessions one start-up renewal
	// transaction extends.
	extendSessionsBatch = 100
)

// endSession removes a session, its locks and its opens. A session that
// holds locks first loses them, in steps of one transaction each (waiters
// for them are woken); such a step marks the session closing. Small
// sessions without locks go in one transaction; a session with many open
// files is taken apart in steps of one transaction each, every step a
// consistent state: the opens it drops are gone together with the orphans
// whose last open they were (queued for GC). The first step that leaves opens behind marks the session closing,
// so it can no longer be renewed or open more files, and the session record
// goes in the last step: if the meta server stops half way, the closing
// session is still there and expiry finishes the job. With onlyExpired it
// does nothing unless the session's lease has run out or its close already
// began (so a renewal racing with expiry wins).
func (s *Service) endSession(ctx context.Context, id string, onlyExpired bool) error {
	for {
		done, err := s.endSessionStep(ctx, id, onlyExpired)
		if err != nil {
			return fmt.Errorf("end session %q: %w", id, err)
		}
		if !done {
			continue
		}
		if s.deleg.n.Load() > 0 {
			gone := false
			err := s.view(ctx, func(x *tx) error {
				_, ok, err := x.t.Get(sessionKey(id))
				gone = !ok
				return err
			})
			if err == nil && gone {
				s.deleg.dropSession(id)
			}
		}
		return nil
	}
}

// endSessionStep is one transaction of endSession; done reports that the
// session is gone (or, with onlyExpired, is to stay).
func (s *Service) endSessionStep(ctx context.Context, id string, onlyExpired bool) (done bool, err error) {
	var unlocked []uint64 // inodes whose locks this step released
	err = s.update(ctx, func(x *tx) error {
		done, unlocked = false, nil
		v, ok, err := x.t.Get(sessionKey(id))
		if err != nil {
			return err
		}
		if !ok {
			done = true
			return nil
		}
		rec := new(sessionRecord)
		if json.Unmarshal(v, rec) != nil {
			rec = &sessionRecord{} // corrupt: end it
		} else if onlyExpired && !rec.Closing && rec.ExpiresNs > x.now {
			done = true
			return nil
		}
		// Locks go first, in steps of their own (see dropSessionLocks);
		// once one is gone the session can never be renewed.
		lockInos, locksGone, err := x.dropSessionLocks(id, txnOpsBudget-3)
		if err != nil {
			return fmt.Errorf("drop locks: %w", err)
		}
		if unlocked = lockInos; len(lockInos) > 0 || !locksGone {
			if rec.Closing {
				return nil
			}
			rec.Closing = true
			return x.putSession(id, rec)
		}
		prefix := sessionOpensPrefix(id)
		var inos []uint64
		err = x.t.Scan(prefix, kv.PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
			ino, err := inoFromKeySuffix(k)
			inos = append(inos, ino)
			return len(inos) < endSessionScan, err
		})
		if err != nil {
			return err
		}
		// Fixed: the session record, the scanned ranges (opens, locks) and
		// keys, the file counter; the session record's write and the
		// counter's.
		cmps, writes, dropped := 4+len(inos), 2, 0
		for _, ino := range inos {
			room := txnOpsBudget - max(cmps, writes)
			if dropped == 0 {
				room = math.MaxInt // the first open goes whatever it costs
			}
			c, w, err := x.dropOpenCost(ino, room)
			if err != nil {
				return err
			}
			if dropped > 0 && (cmps+c > txnOpsBudget || writes+w > txnOpsBudget) {
				break
			}
			cmps, writes = cmps+c, writes+w
			if err := x.dropOpen(id, ino); err != nil {
				return fmt.Errorf("drop open of inode %d: %w", ino, err)
			}
			dropped++
		}
		if dropped == len(inos) && len(inos) < endSessionScan {
			done = true
			return x.t.Delete(sessionKey(id))
		}
		if rec.Closing {
			return nil
		}
		rec.Closing = true
		return x.putSession(id, rec)
	})
	if err == nil {
		for _, ino := range unlocked {
			s.wakeLockWaiters(ino)
		}
	}
	return done, err
}

// dropOpenCost estimates the compares and writes over etcd of dropping a
// session's open of ino: for a plain file the orphan record's read and the
// two open records' deletes; for an orphan, whose last open deletes it,
// also the reads of its opens, inode and xattrs and the deletes of its
// records and xattrs, and its GC queue entry. What it reads counts too, so
// it stops counting xattrs once they do not fit in room and then returns
// room+1.
func (x *tx) dropOpenCost(ino uint64, room int) (cmps, writes int, err error) {
	_, orphan, err := x.t.Get(orphanKey(ino))
	if err != nil || !orphan {
		return 1, 2, err
	}
	const orphanCmps, orphanWrites = 7, 8
	n, cut := 0, false
	prefix := xattrPrefix(ino)
	err = x.t.Scan(prefix, kv.PrefixEnd(prefix), func(_, _ []byte) (bool, error) {
		if orphanWrites+n+1 > room {
			cut = true
			return false, nil
		}
		n++
		return true, nil
	})
	if cut {
		return room + 1, room + 1, err
	}
	return orphanCmps + n, orphanWrites + n, err
}

// extendSessions gives every session at least one full lease from now, in
// batches of extendSessionsBatch sessions per transaction. It runs at
// start-up so that clients that outlived a meta server restart get the
// time to renew instead of losing their open files. Sessions being closed
// are left to expiry.
func (s *Service) extendSessions(ctx context.Context) error {
	from := prefixSession
	for {
		var next []byte
		err := s.update(ctx, func(x *tx) error {
			next = nil
			type session struct {
				id  string
				rec *sessionRecord
			}
			var sessions []session
			n := 0
			err := x.t.Scan(from, kv.PrefixEnd(prefixSession), func(k, v []byte) (bool, error) {
				if n++; n == extendSessionsBatch {
					next = append(append([]byte(nil), k...), 0) // the next batch starts after k
				}
				rec := new(sessionRecord)
				if json.Unmarshal(v, rec) == nil && !rec.Closing {
					sessions = append(sessions, session{string(k[len(prefixSession):]), rec})
				}
				return n < extendSessionsBatch, nil
			})
			if err != nil {
				return err
			}
			for _, ss := range sessions {
				ss.rec.ExpiresNs = max(ss.rec.ExpiresNs, x.now+s.cfg.SessionLease.Nanoseconds())
				if err := x.putSession(ss.id, ss.rec); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || next == nil {
			return err
		}
		from = next
	}
}

// expireSessions ends every session whose lease ran out, and finishes
// closing those whose close was interrupted.
func (s *Service) expireSessions(ctx context.Context) error {
	var expired []string
	err := s.view(ctx, func(x *tx) error {
		return x.t.Scan(prefixSession, kv.PrefixEnd(prefixSession), func(k, v []byte) (bool, error) {
			rec := new(sessionRecord)
			if err := json.Unmarshal(v, rec); err != nil || rec.ExpiresNs <= x.now || rec.Closing {
				expired = append(expired, string(k[len(prefixSession):]))
			}
			return true, nil
		})
	})
	if err != nil {
		return err
	}
	for _, id := range expired {
		if err := s.endSession(ctx, id, true); err != nil {
			return err
		}
		s.log.Warn("session expired without renewal; its open files were released", "session", id)
	}
	return nil
}

// sessionLoop expires sessions until ctx is done.
func (s *Service) sessionLoop(ctx context.Context) {
	interval := min(max(s.cfg.SessionLease/4, 50*time.Millisecond), 5*time.Second)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.expireSessions(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("expire sessions", "err", err)
		}
	}
}
