package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Files created with their data in flight (NewFile.data_in_flight).
//
// A client closing a small file made under a delegation sends the file's
// data to the data servers and its create, with the length, to the meta
// service at the same time, instead of one after the other. Until the
// client confirms that the data servers acknowledged the data, the meta
// service keeps a record of the file (n/if/<ino>). A record still there
// when its session has ended (the client died between the two answers),
// or that the client names as unwritten (the data servers refused the
// data), is resolved: the first chunk is read from the chain's serving
// members, and if none holds the file's length the file is cut to length
// 0 on the data servers and here. So a file never shows a length whose
// bytes no data server holds, as with creates sent after their data; a
// file whose data did not arrive ends empty, not full of zeros.

// inFlightRecord is the value of n/if/<ino>.
type inFlightRecord struct {
	Session string `json:"s"`
	Size    uint64 `json:"n"`
	MtimeNs int64  `json:"m"`
}

// putInFlight records that the data of a, just made by session, is on its
// way to the data servers.
func (x *tx) putInFlight(session string, a *weftv1.Attr) error {
	v, err := json.Marshal(inFlightRecord{Session: session, Size: a.Size, MtimeNs: a.MtimeNs})
	if err != nil {
		return fmt.Errorf("encode the in-flight record of inode %d: %w", a.Ino, err)
	}
	return x.t.Set(inFlightKey(a.Ino), v)
}

// confirmInFlight drops the record of ino; found is false if there was
// none (never made, or resolved already).
func (x *tx) confirmInFlight(ino uint64) (found bool, err error) {
	if _, found, err = x.t.Get(inFlightKey(ino)); err != nil || !found {
		return false, err
	}
	return true, x.t.Delete(inFlightKey(ino))
}

// inFlightOf reads the record of ino.
func (x *tx) inFlightOf(ino uint64) (rec inFlightRecord, ok bool, err error) {
	v, ok, err := x.t.Get(inFlightKey(ino))
	if err != nil || !ok {
		return rec, false, err
	}
	if err := json.Unmarshal(v, &rec); err != nil {
		// Unreadable: resolve against the inode as it is.
		return inFlightRecord{Size: ^uint64(0)}, true, nil
	}
	return rec, true, nil
}

// resolveInFlight settles the record of ino against the data servers: a
// file whose first chunk no serving member holds at the recorded length
// (and that nobody changed since) is cut to length 0. It returns whether
// the file was cut; an error (a data server unreachable) leaves the record
// for a later try.
func (s *Service) resolveInFlight(ctx context.Context, ino uint64) (emptied bool, err error) {
	var rec inFlightRecord
	var a *weftv1.Attr
	var found bool
	err = s.view(ctx, func(x *tx) error {
		var err error
		if rec, found, err = x.inFlightOf(ino); err != nil || !found {
			return err
		}
		a, err = x.inode(ino, "resolve a file whose data was in flight")
		if errors.Is(err, syscall.ENOENT) {
			a, err = nil, nil
		}
		return err
	})
	if err != nil || !found {
		return false, err
	}
	unchanged := func(a *weftv1.Attr) bool {
		return a != nil && a.Size == rec.Size && a.MtimeNs == rec.MtimeNs && isReg(a.Mode) &&
			a.Layout != nil && len(a.Layout.Chains) > 0 && a.Size <= uint64(a.Layout.ChunkSize)
	}
	if unchanged(a) {
		r, err := s.cluster.ProbeChunk(ctx, a.Layout.Chains[0], ino, 0, true)
		if err != nil {
			return false, fmt.Errorf("resolve file %d (its data was in flight): %w", ino, err)
		}
		arrived := false
		for _, h := range r.Holders {
			arrived = arrived || h.Length >= a.Size
		}
		if !arrived {
			// Whatever part came is dropped, so that growing the file
			// later reads zeros.
			if err := s.cluster.TruncateFile(ctx, ino, a.Layout, 0); err != nil {
				return false, fmt.Errorf("resolve file %d (its data was in flight): cut it on the data servers: %w", ino, err)
			}
			emptied = true
		}
	}
	err = s.update(ctx, func(x *tx) error {
		now, ok, err := x.inFlightOf(ino)
		if err != nil || !ok || now != rec {
			return err
		}
		if emptied {
			a, err := x.inode(ino, "resolve a file whose data was in flight")
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				return err
			}
			if err == nil && unchanged(a) {
				a.Size = 0
				a.CtimeNs = x.now
				if err := x.putInode(a); err != nil {
					return err
				}
			}
		}
		return x.t.Delete(inFlightKey(ino))
	})
	if err != nil {
		return false, fmt.Errorf("resolve file %d (its data was in flight): %w", ino, err)
	}
	if emptied {
		s.log.Warn("the data of a file did not reach the data servers (its writer went away or could not write it); the file was cut to length 0",
			"ino", ino, "length", rec.Size, "session", rec.Session)
	}
	return emptied, nil
}

// resolveOrphanedInFlight resolves the records of sessions that have
// ended. A record that cannot be resolved now (a data server down) stays
// for the next round.
func (s *Service) resolveOrphanedInFlight(ctx context.Context) error {
	var inos []uint64
	err := s.view(ctx, func(x *tx) error {
		alive := make(map[string]bool)
		return x.t.Scan(prefixInFlt, kv.PrefixEnd(prefixInFlt), func(k, v []byte) (bool, error) {
			ino, err := inoFromKeySuffix(k)
			if err != nil {
				return false, err
			}
			var rec inFlightRecord
			if json.Unmarshal(v, &rec) == nil {
				live, seen := alive[rec.Session]
				if !seen {
					_, live, err = x.t.Get(sessionKey(rec.Session))
					if err != nil {
						return false, err
					}
					alive[rec.Session] = live
				}
				if live {
					return true, nil
				}
			}
			inos = append(inos, ino)
			return len(inos) < resolveBatch, nil
		})
	})
	if err != nil {
		return err
	}
	var first error
	for _, ino := range inos {
		rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		_, err := s.resolveInFlight(rctx, ino)
		cancel()
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

const (
	// resolveBatch bounds the records one round resolves.
	resolveBatch = 256
	// resolveTimeout bounds the settling of one record (a data server
	// that does not answer leaves it for the next round).
	resolveTimeout = 10 * time.Second
)
