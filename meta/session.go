package meta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
}

// session reads session id; ESTALE if it is unknown or has expired.
func (x *tx) session(id, op string) (*sessionRecord, error) {
	v, ok, err := x.t.Get(sessionKey(id))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fserr.Wrap(syscall.ESTALE, "%s: session %q is unknown or expired; the client must open a new session", op, id)
	}
	rec := new(sessionRecord)
	if err := json.Unmarshal(v, rec); err != nil {
		return nil, fmt.Errorf("%s: corrupt session record %q: %v: %w", op, id, err, syscall.EIO)
	}
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
		return x.putSession(id, &sessionRecord{
			Host: req.Host, MountPoint: req.MountPoint, Version: req.Version,
			ExpiresNs: x.now + s.cfg.SessionLease.Nanoseconds(),
		})
	})
	if err != nil {
		return nil, fmt.Errorf("open session for %s:%s: %w", req.Host, req.MountPoint, err)
	}
	s.log.Info("session opened", "session", id, "host", req.Host, "mount", req.MountPoint)
	return &weftv1.OpenSessionResponse{Session: id, LeaseMs: s.cfg.SessionLease.Milliseconds()}, nil
}

// RenewSession extends a session's lease; ESTALE if it already expired.
func (s *Service) RenewSession(ctx context.Context, req *weftv1.RenewSessionRequest) (*weftv1.RenewSessionResponse, error) {
	err := s.update(ctx, func(x *tx) error {
		rec, err := x.session(req.Session, "renew session")
		if err != nil {
			return err
		}
		rec.ExpiresNs = x.now + s.cfg.SessionLease.Nanoseconds()
		return x.putSession(req.Session, rec)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.RenewSessionResponse{}, nil
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

// endSession removes a session and its opens in one transaction. With
// onlyExpired it does nothing unless the session's lease has run out (so a
// renewal racing with expiry wins).
func (s *Service) endSession(ctx context.Context, id string, onlyExpired bool) error {
	return s.update(ctx, func(x *tx) error {
		v, ok, err := x.t.Get(sessionKey(id))
		if err != nil || !ok {
			return err
		}
		if onlyExpired {
			rec := new(sessionRecord)
			if json.Unmarshal(v, rec) == nil && rec.ExpiresNs > x.now {
				return nil
			}
		}
		prefix := sessionOpensPrefix(id)
		var inos []uint64
		err = x.t.Scan(prefix, kv.PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
			ino, err := inoFromKeySuffix(k)
			inos = append(inos, ino)
			return true, err
		})
		if err != nil {
			return fmt.Errorf("end session %q: %w", id, err)
		}
		for _, ino := range inos {
			if err := x.dropOpen(id, ino); err != nil {
				return fmt.Errorf("end session %q: drop open of inode %d: %w", id, ino, err)
			}
		}
		return x.t.Delete(sessionKey(id))
	})
}

// extendSessions gives every session at least one full lease from now.
// It runs at start-up so that clients that outlived a meta server restart
// get the time to renew instead of losing their open files.
func (s *Service) extendSessions(ctx context.Context) error {
	return s.update(ctx, func(x *tx) error {
		recs := map[string]*sessionRecord{}
		err := x.t.Scan(prefixSession, kv.PrefixEnd(prefixSession), func(k, v []byte) (bool, error) {
			rec := new(sessionRecord)
			if json.Unmarshal(v, rec) == nil {
				recs[string(k[len(prefixSession):])] = rec
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		for id, rec := range recs {
			rec.ExpiresNs = max(rec.ExpiresNs, x.now+s.cfg.SessionLease.Nanoseconds())
			if err := x.putSession(id, rec); err != nil {
				return err
			}
		}
		return nil
	})
}

// expireSessions ends every session whose lease ran out.
func (s *Service) expireSessions(ctx context.Context) error {
	var expired []string
	err := s.view(ctx, func(x *tx) error {
		return x.t.Scan(prefixSession, kv.PrefixEnd(prefixSession), func(k, v []byte) (bool, error) {
			rec := new(sessionRecord)
			if err := json.Unmarshal(v, rec); err != nil || rec.ExpiresNs <= x.now {
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
