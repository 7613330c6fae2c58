package meta

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"syscall"

	"github.com/weft-fs/weft/meta/kv"
)

// Hot keys. A create that wrote n/next and n/cnt/files would make every
// two concurrent creates conflict on the etcd engine (optimistic
// transactions), however far apart their directories are. So:
//
//   - inode numbers come from ranges of inoRangeSize numbers that a meta
//     server reserves in n/next with one small transaction of its own
//     (takeIno), outside the creating transaction. n/next stays above
//     every inode number ever handed out; numbers are never reused; a
//     range a meta server had not used up when it stopped is a gap.
//   - the file and directory counters are split into countShards shards
//     by inode number (n/cnt/s/<kind><shard>), each holding two counters
//     that only grow: inodes made and inodes removed. The count is the
//     base key (n/cnt/files, n/cnt/dirs: the count before shards existed,
//     or what fsck set) plus made minus removed over all shards; it is
//     exact in every snapshot. Because shard counters only grow, the sum
//     of all of them (counts.changes) changes with every create and
//     removal, which tells a scan whether the namespace stayed still.

// inoRangeSize is how many inode numbers a meta server reserves at once.
const inoRangeSize = 1024

// countShards is the number of shards of each counter.
const countShards = 64

// Counter kinds: the byte after n/cnt/s/.
const (
	countKindFiles = 'f'
	countKindDirs  = 'd'
)

var prefixCountShard = []byte("n/cnt/s/")

// countShardKey is the shard of kind that counts inode ino.
func countShardKey(kind byte, ino uint64) []byte {
	k := append(append([]byte(nil), prefixCountShard...), kind, 0, 0)
	binary.BigEndian.PutUint16(k[len(k)-2:], uint16(ino%countShards))
	return k
}

// inoRanges is a meta server's current range of reserved inode numbers.
type inoRanges struct {
	mu        sync.Mutex
	next, end uint64 // [next, end) reserved and not handed out
}

// takeIno hands out an inode number for a new inode, reserving a new range
// in n/next when the current one is used up. It must be called outside
// any transaction. A number taken for an operation that then fails is not
// handed out again.
func (s *Service) takeIno(ctx context.Context) (uint64, error) {
	r := &s.inos
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next == r.end {
		lo, err := s.reserveInos(ctx, inoRangeSize)
		if err != nil {
			return 0, err
		}
		r.next, r.end = lo, lo+inoRangeSize
	}
	ino := r.next
	r.next++
	return ino, nil
}

// countInode counts inode ino (a directory or not) as made (delta 1) or
// removed (delta -1).
func (x *tx) countInode(dir bool, ino uint64, delta int) error {
	kind := byte(countKindFiles)
	if dir {
		kind = countKindDirs
	}
	k := countShardKey(kind, ino)
	v, _, err := x.t.Get(k)
	if err != nil {
		return err
	}
	made, removed, err := decodeShard(k, v)
	if err != nil {
		return err
	}
	if delta > 0 {
		made++
	} else {
		removed++
	}
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, made)
	binary.BigEndian.PutUint64(b[8:], removed)
	return x.t.Set(k, b)
}

func decodeShard(k, v []byte) (made, removed uint64, err error) {
	switch len(v) {
	case 0:
		return 0, 0, nil
	case 16:
		return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), nil
	}
	return 0, 0, fmt.Errorf("corrupt counter shard %q: %d bytes (want 16): %w", k, len(v), syscall.EIO)
}

// counts are the file and directory counters as of one snapshot.
type counts struct {
	files, dirs uint64
	// changes grows with every inode made or removed (and every repair).
	changes uint64
}

// readCounts sums the counters' base keys and shards.
func readCounts(t kv.Txn) (counts, error) {
	var c counts
	base := map[byte]int64{}
	for kind, key := range map[byte][]byte{countKindFiles: keyCountFiles, countKindDirs: keyCountDirs} {
		v, err := getUint64(t, key)
		if err != nil {
			return c, err
		}
		base[kind] = int64(v)
		c.changes += v
	}
	err := t.Scan(prefixCountShard, kv.PrefixEnd(prefixCountShard), func(k, v []byte) (bool, error) {
		made, removed, err := decodeShard(k, v)
		if err != nil {
			return false, err
		}
		if len(k) != len(prefixCountShard)+3 {
			return false, fmt.Errorf("corrupt counter shard key %q: %w", k, syscall.EIO)
		}
		base[k[len(prefixCountShard)]] += int64(made - removed)
		c.changes += made + removed
		return true, nil
	})
	c.files, c.dirs = uint64(max(base[countKindFiles], 0)), uint64(max(base[countKindDirs], 0))
	return c, err
}

// setCount repairs a counter (dir: the directories', else the files') so
// that it reads want: its base key takes want minus what the shards add.
func setCount(t kv.Txn, dir bool, want uint64) error {
	kind, key := byte(countKindFiles), keyCountFiles
	if dir {
		kind, key = countKindDirs, keyCountDirs
	}
	var shards int64
	p := append(append([]byte(nil), prefixCountShard...), kind)
	err := t.Scan(p, kv.PrefixEnd(p), func(k, v []byte) (bool, error) {
		made, removed, err := decodeShard(k, v)
		shards += int64(made - removed)
		return err == nil, err
	})
	if err != nil {
		return err
	}
	return t.Set(key, be64(uint64(int64(want)-shards)))
}
