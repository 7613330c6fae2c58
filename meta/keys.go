package meta

import (
	"encoding/binary"
	"fmt"

	"github.com/weft-fs/weft/meta/kv"
)

// Key schema of the namespace. Every key starts with "n/" (the cluster
// manager's keys start with "c/"). Integers are big-endian uint64 ("be64")
// so that keys sort numerically; names are raw bytes.
//
//	key                                value                                     written by
//	---------------------------------  ----------------------------------------  ------------------------------
//	n/cid                              cluster id (text)                         first start
//	n/next                             next inode number (be64), never reused:   reserving a range of 1024
//	                                   above every number handed out             numbers (counters.go)
//	n/cnt/files                        base of the non-directory count (be64,    first start, fsck repair
//	                                   two's complement)
//	n/cnt/dirs                         base of the directory count (incl. root)  first start, fsck repair
//	n/cnt/s/<kind><shard be16>         counter shard, kind 'f' files or 'd'      create/mkdir/symlink, removal
//	                                   dirs, shard = ino % 64: made be64 +       of the inode
//	                                   removed be64 (both only grow); count =
//	                                   base + made - removed over all shards
//	n/i/<ino>                          inode: weftv1.Attr (protobuf), with the   every change of the inode
//	                                   layout of a regular file
//	n/l/<ino>                          symlink target (raw bytes)                symlink
//	n/p/<dir ino>                      parent directory of a directory (be64)    mkdir, rename
//	n/d/<parent ino>/<name>            child ino (be64) + file type (be32)       create, mkdir, link, rename...
//	n/x/<ino>/<name>                   extended attribute value                  setxattr
//	n/y/<dir ino>                      directory default layout (weftv1.Layout)  setlayout on a directory
//	n/s/<session id>                   session record (JSON: host, mount point,  open/renew session
//	                                   expiry in ns)
//	n/o/<ino>/<session id>             open count of ino in session (be64)       open, create, release
//	n/so/<session id>/<ino>            empty: index of a session's opens         open, create, release
//	n/or/<ino>                         empty: orphan (nlink 0, still open, or    unlink/rename of an open file
//	                                   unlinked in the grace period)             (or any in the grace period)
//	n/gc/<ino>                         layout (weftv1.Layout) of a deleted file  last unlink or last release
//	                                   whose chunks the GC loop must delete
//	n/lk/<ino>/<kind>/<session>/       lock record: end be64, type byte (0 read,  setlock, session end
//	  <owner be64><start be64>         1 write), pid be32; kind 'p' POSIX
//	                                   (fcntl) or 'f' flock (see locks_store.go)
//	n/lks/<session id>/<ino>           number of the session's lock records on   setlock, session end
//	                                   ino (be64): index of a session's locks
//	n/rq/<request id>                  applied namespace request (expiry), so a  mutations from clients with
//	                                   resent one is applied once (ha_requests)  several meta servers
//	n/lg                               layout generation (be64): bumped by every  setlayout on a directory, rename
//	                                   change that may alter the effective       of a directory to another parent,
//	                                   layout of directories (layoutcache.go)    fsck moving a directory
//	n/dead/<ino>                       empty: a number whose chunks fsck found   fsck --repair of unowned chunks
//	                                   unowned and queued for deletion: a file
//	                                   made under a delegation with it (its data
//	                                   ahead of its create) is refused
//	n/stop                             empty: the service stopped cleanly with   Close (lazy opens), removed at
//	                                   every open record synced (replay.go)      the next start
//	n/grace                            empty: a grace period began and its sweep start after a crash, removed when
//	                                   of orphans has not finished; the next     the sweep after the grace period
//	                                   start has one too (replay.go)             has deleted the orphans
//	n/cbw                              id of the meta server of the last write   every update (etcd engine)
//	                                   (lets callbacks skip a server's own
//	                                   changes; nobody reads it)
//
// An inode record exists exactly as long as the inode is reachable from a
// dentry or is an orphan; a regular file's record is removed in the
// transaction that queues it under n/gc/, so the GC queue owns the layout
// from then on.
var (
	keyClusterID  = []byte("n/cid")
	keyNextIno    = []byte("n/next")
	keyCountFiles = []byte("n/cnt/files")
	keyCountDirs  = []byte("n/cnt/dirs")
	keyLayoutGen  = []byte("n/lg")
	keyCleanStop  = []byte("n/stop")
	keyGrace      = []byte("n/grace")

	prefixInode   = []byte("n/i/")
	prefixSymlink = []byte("n/l/")
	prefixParent  = []byte("n/p/")
	prefixDentry  = []byte("n/d/")
	prefixXattr   = []byte("n/x/")
	prefixLayout  = []byte("n/y/")
	prefixSession = []byte("n/s/")
	prefixOpen    = []byte("n/o/")
	prefixSessOpn = []byte("n/so/")
	prefixOrphan  = []byte("n/or/")
	prefixGC      = []byte("n/gc/")
	prefixDead    = []byte("n/dead/")
)

// rootIno is the inode number of the file system root.
const rootIno = 1

func be64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func keyWithIno(prefix []byte, ino uint64) []byte {
	k := make([]byte, 0, len(prefix)+8)
	k = append(k, prefix...)
	return append(k, be64(ino)...)
}

func inodeKey(ino uint64) []byte   { return keyWithIno(prefixInode, ino) }
func symlinkKey(ino uint64) []byte { return keyWithIno(prefixSymlink, ino) }
func parentKey(ino uint64) []byte  { return keyWithIno(prefixParent, ino) }
func layoutKey(ino uint64) []byte  { return keyWithIno(prefixLayout, ino) }
func orphanKey(ino uint64) []byte  { return keyWithIno(prefixOrphan, ino) }
func gcKey(ino uint64) []byte      { return keyWithIno(prefixGC, ino) }
func deadKey(ino uint64) []byte    { return keyWithIno(prefixDead, ino) }

// dentryPrefix is the prefix of all entries of directory dir.
func dentryPrefix(dir uint64) []byte { return append(keyWithIno(prefixDentry, dir), '/') }

func dentryKey(dir uint64, name string) []byte { return append(dentryPrefix(dir), name...) }

func xattrPrefix(ino uint64) []byte { return append(keyWithIno(prefixXattr, ino), '/') }

func xattrKey(ino uint64, name string) []byte { return append(xattrPrefix(ino), name...) }

func sessionKey(id string) []byte { return append(append([]byte(nil), prefixSession...), id...) }

func openPrefix(ino uint64) []byte { return append(keyWithIno(prefixOpen, ino), '/') }

func openKey(ino uint64, session string) []byte { return append(openPrefix(ino), session...) }

func sessionOpensPrefix(session string) []byte {
	k := append(append([]byte(nil), prefixSessOpn...), session...)
	return append(k, '/')
}

func sessionOpenKey(session string, ino uint64) []byte {
	return append(sessionOpensPrefix(session), be64(ino)...)
}

// inoFromKeySuffix decodes the be64 inode number that ends key.
func inoFromKeySuffix(key []byte) (uint64, error) {
	if len(key) < 8 {
		return 0, fmt.Errorf("metadata key %q too short for an inode number", key)
	}
	return binary.BigEndian.Uint64(key[len(key)-8:]), nil
}

// encodeDentry is the value of a dentry: child inode and its file type.
func encodeDentry(ino uint64, typ uint32) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint64(b, ino)
	binary.BigEndian.PutUint32(b[8:], typ)
	return b
}

func decodeDentry(v []byte) (ino uint64, typ uint32, err error) {
	if len(v) != 12 {
		return 0, 0, fmt.Errorf("corrupt directory entry value of %d bytes (want 12)", len(v))
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint32(v[8:]), nil
}

// getUint64 reads a be64 counter; absent keys read as 0.
func getUint64(t kv.Txn, key []byte) (uint64, error) {
	v, ok, err := t.Get(key)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("corrupt counter %q: %d bytes (want 8)", key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// addUint64 adds delta to the be64 counter at key, never going below zero.
func addUint64(t kv.Txn, key []byte, delta int64) error {
	v, err := getUint64(t, key)
	if err != nil {
		return err
	}
	switch {
	case delta >= 0:
		v += uint64(delta)
	case uint64(-delta) > v:
		v = 0
	default:
		v -= uint64(-delta)
	}
	return t.Set(key, be64(v))
}

// hasPrefix reports whether any key starts with prefix.
func hasPrefix(t kv.Txn, prefix []byte) (bool, error) {
	found := false
	err := t.Scan(prefix, kv.PrefixEnd(prefix), func(_, _ []byte) (bool, error) {
		found = true
		return false, nil
	})
	return found, err
}

// deletePrefix removes every key starting with prefix.
func deletePrefix(t kv.Txn, prefix []byte) error {
	var keys [][]byte
	err := t.Scan(prefix, kv.PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
		keys = append(keys, append([]byte(nil), k...))
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := t.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
