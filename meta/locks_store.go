package meta

import (
	"encoding/binary"
	"fmt"

	"github.com/weft-fs/weft/meta/kv"
)

// Lock keys (see keys.go):
//
//	n/lk/<ino>/<kind>/<session>/<owner be64><start be64>  end be64, type byte, pid be32
//	n/lks/<session>/<ino>                                  number of the session's lock records on ino (be64)
//
// kind is 'p' for POSIX (fcntl) locks and 'f' for flock locks: the two
// never interact (Linux semantics). All locks of one kind on an inode are
// one range scan, and a session's locks are found through its index.
var (
	prefixLock     = []byte("n/lk/")
	prefixSessLock = []byte("n/lks/")
)

// lockKind tells POSIX and flock locks apart in keys.
type lockKind byte

const (
	kindPOSIX lockKind = 'p'
	kindFlock lockKind = 'f'
)

// lockDropPerInode is the compares dropSessionLocks counts per inode
// besides its records and index entry: four range scans and one spare
// (the check for records left may read one). lockDropIndexScan is how
// many index entries one step reads.
const (
	lockDropPerInode  = 5
	lockDropIndexScan = 16
)

// lockValueLen is the length of a lock record's value.
const lockValueLen = 8 + 1 + 4

func lockKindPrefix(ino uint64, kind lockKind) []byte {
	k := append(keyWithIno(prefixLock, ino), '/', byte(kind), '/')
	return k
}

func lockSessionPrefix(ino uint64, kind lockKind, session string) []byte {
	return append(append(lockKindPrefix(ino, kind), session...), '/')
}

func lockKey(ino uint64, kind lockKind, l *heldLock) []byte {
	k := lockSessionPrefix(ino, kind, l.session)
	k = append(k, be64(l.owner)...)
	return append(k, be64(l.start)...)
}

func encodeLock(l *heldLock) []byte {
	v := make([]byte, lockValueLen)
	binary.BigEndian.PutUint64(v, l.end)
	v[8] = byte(l.typ)
	binary.BigEndian.PutUint32(v[9:], l.pid)
	return v
}

// decodeLock parses a lock record whose key starts with kindPrefix.
func decodeLock(kindPrefix, key, value []byte) (heldLock, error) {
	rest := key[len(kindPrefix):]
	if len(rest) < 1+16 || rest[len(rest)-17] != '/' || len(value) != lockValueLen || value[8] > lockWrite {
		return heldLock{}, fmt.Errorf("corrupt lock record %q", key)
	}
	l := heldLock{
		lockOwner: lockOwner{session: string(rest[:len(rest)-17]), owner: binary.BigEndian.Uint64(rest[len(rest)-16:])},
		start:     binary.BigEndian.Uint64(rest[len(rest)-8:]),
		end:       binary.BigEndian.Uint64(value),
		typ:       uint32(value[8]),
		pid:       binary.BigEndian.Uint32(value[9:]),
	}
	if l.end < l.start {
		return heldLock{}, fmt.Errorf("corrupt lock record %q: end %d before start %d", key, l.end, l.start)
	}
	return l, nil
}

func sessionLocksPrefix(session string) []byte {
	return append(append(append([]byte(nil), prefixSessLock...), session...), '/')
}

func sessionLockKey(session string, ino uint64) []byte {
	return append(sessionLocksPrefix(session), be64(ino)...)
}

// locksOn reads every lock of kind on ino.
func (x *tx) locksOn(ino uint64, kind lockKind) ([]heldLock, error) {
	prefix := lockKindPrefix(ino, kind)
	var all []heldLock
	err := x.t.Scan(prefix, kv.PrefixEnd(prefix), func(k, v []byte) (bool, error) {
		l, err := decodeLock(prefix, k, v)
		all = append(all, l)
		return true, err
	})
	return all, err
}

// replaceOwnerLocks writes an owner's new set of locks of kind on ino in
// place of its old one, keeping the session's lock index count right.
func (x *tx) replaceOwnerLocks(ino uint64, kind lockKind, who lockOwner, old, now []heldLock) error {
	had := make(map[string]heldLock, len(old))
	for _, l := range old {
		had[string(lockKey(ino, kind, &l))] = l
	}
	keep := make(map[string]bool, len(now))
	for i := range now {
		k := lockKey(ino, kind, &now[i])
		keep[string(k)] = true
		if l, ok := had[string(k)]; ok && l == now[i] {
			continue // unchanged
		}
		if err := x.t.Set(k, encodeLock(&now[i])); err != nil {
			return err
		}
	}
	for i := range old {
		if k := lockKey(ino, kind, &old[i]); !keep[string(k)] {
			if err := x.t.Delete(k); err != nil {
				return err
			}
		}
	}
	return x.addSessionLocks(who.session, ino, len(now)-len(old))
}

// addSessionLocks adds delta to the count of the session's lock records on
// ino; the index entry goes when the count reaches zero.
func (x *tx) addSessionLocks(session string, ino uint64, delta int) error {
	if delta == 0 {
		return nil
	}
	key := sessionLockKey(session, ino)
	n, err := getUint64(x.t, key)
	if err != nil {
		return err
	}
	m := int64(n) + int64(delta)
	if m <= 0 {
		return x.t.Delete(key)
	}
	return x.t.Set(key, be64(uint64(m)))
}

// dropSessionLocks removes up to about room of a session's lock records
// (at least one inode's worth if it has any), in one transaction. It
// returns the inodes whose locks it touched and whether the session has
// no locks left. Over etcd each record read costs one compare and its
// delete one write; each index entry read one compare, each inode
// lockDropPerInode more (four range scans) and a write (its index entry).
func (x *tx) dropSessionLocks(session string, room int) (inos []uint64, done bool, err error) {
	prefix := sessionLocksPrefix(session)
	type entry struct {
		ino   uint64
		count uint64
	}
	var entries []entry
	err = x.t.Scan(prefix, kv.PrefixEnd(prefix), func(k, v []byte) (bool, error) {
		ino, err := inoFromKeySuffix(k)
		if err != nil {
			return false, err
		}
		var n uint64
		if len(v) == 8 {
			n = binary.BigEndian.Uint64(v)
		}
		entries = append(entries, entry{ino, n})
		return len(entries) < lockDropIndexScan, nil
	})
	if err != nil || len(entries) == 0 {
		return nil, len(entries) == 0, err
	}
	used := 1 + len(entries) // the index scan and what it read
	for i, e := range entries {
		if i > 0 && used+int(e.count)+lockDropPerInode > room {
			return inos, false, nil
		}
		used += lockDropPerInode
		inos = append(inos, e.ino)
		removed := 0
		for _, kind := range []lockKind{kindPOSIX, kindFlock} {
			p := lockSessionPrefix(e.ino, kind, session)
			var keys [][]byte
			if used < room {
				err := x.t.Scan(p, kv.PrefixEnd(p), func(k, _ []byte) (bool, error) {
					keys = append(keys, append([]byte(nil), k...))
					used++
					return used < room, nil
				})
				if err != nil {
					return nil, false, err
				}
			}
			for _, k := range keys {
				if err := x.t.Delete(k); err != nil {
					return nil, false, err
				}
			}
			removed += len(keys)
		}
		left, err := x.sessionHasLocksOn(session, e.ino)
		if err != nil {
			return nil, false, err
		}
		if left {
			// Cut short by room: the rest goes in the next step.
			return inos, false, x.t.Set(sessionLockKey(session, e.ino), be64(max(e.count, uint64(removed))-uint64(removed)))
		}
		if err := x.t.Delete(sessionLockKey(session, e.ino)); err != nil {
			return nil, false, err
		}
	}
	return inos, len(entries) < lockDropIndexScan, nil
}

// sessionHasLocksOn reports whether the session still holds a lock record
// of either kind on ino (records deleted in this transaction do not
// count).
func (x *tx) sessionHasLocksOn(session string, ino uint64) (bool, error) {
	for _, kind := range []lockKind{kindPOSIX, kindFlock} {
		ok, err := hasPrefix(x.t, lockSessionPrefix(ino, kind, session))
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// sessionLockCount sums a session's lock index: how many lock records it
// holds.
func (x *tx) sessionLockCount(session string) (uint64, error) {
	prefix := sessionLocksPrefix(session)
	var n uint64
	err := x.t.Scan(prefix, kv.PrefixEnd(prefix), func(_, v []byte) (bool, error) {
		if len(v) == 8 {
			n += binary.BigEndian.Uint64(v)
		}
		return true, nil
	})
	return n, err
}
