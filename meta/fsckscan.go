package meta

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// fsckScanPage is how many keys one read-only transaction of the fsck scan
// reads: the scan is a series of short snapshots, never one long one (an
// etcd snapshot may be compacted away under a long scan).
const fsckScanPage = 1000

// scanInode is what the scan keeps of an inode record.
type scanInode struct {
	mode, nlink uint32
	// fp fingerprints the whole record: every operation that changes the
	// inode's names (link, unlink, rename) or, for a directory, its entries
	// rewrites the record with a new ctime, so an unchanged fingerprint
	// proves that nothing of the kind happened since the scan read it.
	fp        uint64
	size      uint64
	chunkSize uint64
	chains    []uint64
}

// entryRef names a directory entry.
type entryRef struct {
	parent uint64
	name   string
	ino    uint64 // the inode the entry named when scanned
}

// openRef is an open record (n/o/<ino>/<session>).
type openRef struct {
	ino     uint64
	session string
}

// nsScan is what one pass over the namespace saw. The pass is made of
// many snapshots taken while the file system is in use, so it is not a
// consistent picture: it only yields candidates that are verified again,
// each in a transaction of its own, before they are reported.
type nsScan struct {
	// Counters read in one snapshot before the inode scan and in one after.
	nextBefore, nextAfter   uint64
	filesBefore, dirsBefore kindCount
	filesAfter, dirsAfter   kindCount
	files, dirs             uint64 // inodes seen by type

	inodes  map[uint64]scanInode
	maxIno  uint64
	entries uint64
	// refs counts the entries naming each scanned inode (entries in an
	// existing directory only); dirNames lists them for directories.
	refs       map[uint64]uint32
	dirNames   map[uint64][]entryRef
	dangling   []entryRef // entries naming an inode the scan did not see
	inMissing  []entryRef // entries in a directory the scan did not see
	mismatched []entryRef // entry type differs from the inode's
	parents    map[uint64]uint64
	symlinks   map[uint64]bool
	staleRecs  map[string][]uint64 // record prefix -> inodes without a matching inode
	opens      []openRef
	sessOpens  map[openRef]bool
	sessions   map[string]bool
	orphans    map[uint64]bool
	gc         map[uint64]bool
	corrupt    []*weftv1.FsckProblem
}

// fingerprint hashes an inode record.
func fingerprint(v []byte) uint64 {
	h := fnv.New64a()
	h.Write(v)
	return h.Sum64()
}

// scanPaged calls fn for every key with prefix, fsckScanPage keys per
// read-only transaction.
func (s *Service) scanPaged(ctx context.Context, prefix []byte, fn func(k, v []byte) error) error {
	start := prefix
	end := kv.PrefixEnd(prefix)
	for {
		n := 0
		var last []byte
		err := s.eng.View(ctx, func(t kv.Txn) error {
			n, last = 0, nil
			return t.Scan(start, end, func(k, v []byte) (bool, error) {
				if n == fsckScanPage {
					return false, nil
				}
				n++
				last = append(last[:0], k...)
				return true, fn(k, v)
			})
		})
		if err != nil {
			return fmt.Errorf("scan %q: %w", prefix, err)
		}
		if n < fsckScanPage {
			return nil
		}
		start = append(last, 0)
	}
}

// kindCount is the file or the directory counter as one snapshot saw it.
type kindCount struct {
	count   uint64
	changes uint64 // made + removed over all shards: grows with every change
	shards  int64  // made - removed over all shards
}

// kindBaseKey is the base key of the directory or the file counter.
func kindBaseKey(dir bool) []byte {
	if dir {
		return keyCountDirs
	}
	return keyCountFiles
}

// readKindCount reads the directory (or file) counter: its base key and
// its shards (65 reads, within a transaction's limit).
func readKindCount(t kv.Txn, dir bool) (kindCount, error) {
	var c kindCount
	base, err := getUint64(t, kindBaseKey(dir))
	if err != nil {
		return c, err
	}
	kind := byte(countKindFiles)
	if dir {
		kind = countKindDirs
	}
	p := append(append([]byte(nil), prefixCountShard...), kind)
	err = t.Scan(p, kv.PrefixEnd(p), func(k, v []byte) (bool, error) {
		made, removed, err := decodeShard(k, v)
		c.shards += int64(made - removed)
		c.changes += made + removed
		return err == nil, err
	})
	c.count = uint64(max(int64(base)+c.shards, 0))
	c.changes += base
	return c, err
}

// readCounters reads n/next and both counters in one snapshot.
func (s *Service) readCounters(ctx context.Context) (next uint64, files, dirs kindCount, err error) {
	err = s.view(ctx, func(x *tx) error {
		var err error
		if next, err = getUint64(x.t, keyNextIno); err != nil {
			return err
		}
		if files, err = readKindCount(x.t, false); err != nil {
			return err
		}
		dirs, err = readKindCount(x.t, true)
		return err
	})
	return next, files, dirs, err
}

// scanNamespace reads the whole namespace in pages: inodes first, then
// entries (so an inode whose fingerprint is unchanged afterwards had the
// same names throughout the entry scan), then the other records.
func (s *Service) scanNamespace(ctx context.Context) (*nsScan, error) {
	sc := &nsScan{
		inodes: map[uint64]scanInode{}, refs: map[uint64]uint32{}, dirNames: map[uint64][]entryRef{},
		parents: map[uint64]uint64{}, symlinks: map[uint64]bool{}, staleRecs: map[string][]uint64{},
		sessOpens: map[openRef]bool{}, sessions: map[string]bool{}, orphans: map[uint64]bool{}, gc: map[uint64]bool{},
	}
	var err error
	if sc.nextBefore, sc.filesBefore, sc.dirsBefore, err = s.readCounters(ctx); err != nil {
		return nil, err
	}
	err = s.scanPaged(ctx, prefixInode, func(k, v []byte) error {
		ino, err := inoFromKeySuffix(k)
		if err != nil {
			sc.corrupt = append(sc.corrupt, &weftv1.FsckProblem{Kind: fsckCorrupt, Detail: fmt.Sprintf("malformed inode key %q; it is left as it is", k)})
			return nil
		}
		a := new(weftv1.Attr)
		if err := proto.Unmarshal(v, a); err != nil {
			sc.corrupt = append(sc.corrupt, &weftv1.FsckProblem{Kind: fsckCorrupt, Ino: ino,
				Detail: fmt.Sprintf("the record of inode %d does not decode (%v); it is left as it is", ino, err)})
			return nil
		}
		in := scanInode{mode: a.Mode, nlink: a.Nlink, fp: fingerprint(v), size: a.Size}
		if l := a.Layout; isReg(a.Mode) && l != nil {
			in.chunkSize, in.chains = uint64(l.ChunkSize), l.Chains
		}
		sc.inodes[ino] = in
		sc.maxIno = max(sc.maxIno, ino)
		if isDir(a.Mode) {
			sc.dirs++
		} else {
			sc.files++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if sc.nextAfter, sc.filesAfter, sc.dirsAfter, err = s.readCounters(ctx); err != nil {
		return nil, err
	}
	if err := s.scanEntries(ctx, sc); err != nil {
		return nil, err
	}
	return sc, s.scanRecords(ctx, sc)
}

// scanEntries counts the names of every inode.
func (s *Service) scanEntries(ctx context.Context, sc *nsScan) error {
	return s.scanPaged(ctx, prefixDentry, func(k, v []byte) error {
		sc.entries++
		rest := k[len(prefixDentry):]
		if len(rest) < 9 || rest[8] != '/' {
			sc.corrupt = append(sc.corrupt, &weftv1.FsckProblem{Kind: fsckCorrupt, Detail: fmt.Sprintf("malformed entry key %q", k)})
			return nil
		}
		parent, _ := inoFromKeySuffix(rest[:8])
		e := entryRef{parent: parent, name: string(rest[9:])}
		ino, typ, err := decodeDentry(v)
		if err != nil {
			sc.corrupt = append(sc.corrupt, &weftv1.FsckProblem{Kind: fsckCorrupt, Parent: parent, Name: e.name,
				Detail: fmt.Sprintf("entry %q in directory %d: %v; it is left as it is", e.name, parent, err)})
			return nil
		}
		e.ino = ino
		if d, ok := sc.inodes[parent]; !ok || !isDir(d.mode) {
			sc.inMissing = append(sc.inMissing, e)
			return nil
		}
		a, ok := sc.inodes[ino]
		if !ok {
			sc.dangling = append(sc.dangling, e)
			return nil
		}
		sc.refs[ino]++
		if isDir(a.mode) {
			sc.dirNames[ino] = append(sc.dirNames[ino], e)
		}
		if typ != fileType(a.mode) {
			sc.mismatched = append(sc.mismatched, e)
		}
		return nil
	})
}

// Record prefixes whose inode must exist (with the right type).
var fsckRecordPrefixes = []struct {
	prefix []byte
	what   string
	wants  func(mode uint32) bool
}{
	{prefixSymlink, "symlink target", isLink},
	{prefixParent, "parent record", isDir},
	{prefixLayout, "default layout", isDir},
	{prefixXattr, "extended attribute", nil},
}

// scanRecords reads the per-inode records, sessions, opens, orphans and
// the GC queue.
func (s *Service) scanRecords(ctx context.Context, sc *nsScan) error {
	for _, r := range fsckRecordPrefixes {
		var lastIno uint64
		err := s.scanPaged(ctx, r.prefix, func(k, v []byte) error {
			rest := k[len(r.prefix):]
			if len(rest) < 8 {
				return nil
			}
			ino, _ := inoFromKeySuffix(rest[:8])
			if bytes.Equal(r.prefix, prefixSymlink) {
				sc.symlinks[ino] = true
			}
			if bytes.Equal(r.prefix, prefixParent) && len(v) == 8 {
				sc.parents[ino], _ = inoFromKeySuffix(v)
			}
			a, ok := sc.inodes[ino]
			if (ok && (r.wants == nil || r.wants(a.mode))) || ino == lastIno {
				return nil
			}
			lastIno = ino
			sc.staleRecs[r.what] = append(sc.staleRecs[r.what], ino)
			return nil
		})
		if err != nil {
			return err
		}
	}
	err := s.scanPaged(ctx, prefixSession, func(k, _ []byte) error {
		sc.sessions[string(k[len(prefixSession):])] = true
		return nil
	})
	if err != nil {
		return err
	}
	err = s.scanPaged(ctx, prefixOpen, func(k, _ []byte) error {
		rest := k[len(prefixOpen):]
		if len(rest) < 9 {
			return nil
		}
		ino, _ := inoFromKeySuffix(rest[:8])
		sc.opens = append(sc.opens, openRef{ino: ino, session: string(rest[9:])})
		return nil
	})
	if err != nil {
		return err
	}
	err = s.scanPaged(ctx, prefixSessOpn, func(k, _ []byte) error {
		rest := k[len(prefixSessOpn):]
		if len(rest) < 9 {
			return nil
		}
		ino, _ := inoFromKeySuffix(rest)
		sc.sessOpens[openRef{ino: ino, session: string(rest[:len(rest)-9])}] = true
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range []struct {
		prefix []byte
		set    map[uint64]bool
	}{{prefixOrphan, sc.orphans}, {prefixGC, sc.gc}} {
		err := s.scanPaged(ctx, p.prefix, func(k, _ []byte) error {
			ino, err := inoFromKeySuffix(k)
			if err != nil {
				sc.corrupt = append(sc.corrupt, &weftv1.FsckProblem{Kind: fsckCorrupt, Detail: fmt.Sprintf("malformed key %q; it is left as it is", k)})
				return nil
			}
			p.set[ino] = true
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
