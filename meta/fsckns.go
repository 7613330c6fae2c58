package meta

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// fsckRecordBatch bounds the keys one repair transaction deletes (the etcd
// engine takes at most 128 operations per transaction).
const fsckRecordBatch = 50

// currentInode reads inode ino with its fingerprint; ok is false if it
// does not exist or does not decode.
func (x *tx) currentInode(ino uint64) (a *weftv1.Attr, fp uint64, ok bool, err error) {
	v, found, err := x.t.Get(inodeKey(ino))
	if err != nil || !found {
		return nil, 0, false, err
	}
	fp = fingerprint(v)
	a, err = x.inode(ino, "fsck")
	if err != nil {
		return nil, 0, false, nil // corrupt: reported by the scan
	}
	return a, fp, true, nil
}

// unchanged reads inode ino and reports whether its record is the one the
// scan fingerprinted.
func (f *fscker) unchanged(x *tx, ino uint64) (*weftv1.Attr, bool, error) {
	a, fp, ok, err := x.currentInode(ino)
	if err != nil || !ok {
		return nil, false, err
	}
	in, seen := f.scan.inodes[ino]
	return a, seen && in.fp == fp, nil
}

func problem(kind string, ino, parent uint64, name string, repaired bool, format string, args ...any) *weftv1.FsckProblem {
	return &weftv1.FsckProblem{Kind: kind, Ino: ino, Parent: parent, Name: name, Repaired: repaired, Detail: fmt.Sprintf(format, args...)}
}

// checkCounters compares the file and directory counters with the inodes
// counted. A count is exact only if no inode of its kind was made or
// removed while the inodes were scanned: the counter's shards only grow
// (made, removed), so their sum tells, and it must also be the same when
// the repair runs. A busy file system skips the check.
func (f *fscker) checkCounters(ctx context.Context) error {
	sc := f.scan
	for _, c := range []struct {
		dir           bool
		what          string
		before, after kindCount
		want          uint64
	}{{false, "files", sc.filesBefore, sc.filesAfter, sc.files}, {true, "directories", sc.dirsBefore, sc.dirsAfter, sc.dirs}} {
		if c.before != c.after {
			f.s.log.Info("fsck: inodes were created or removed during the scan; their counter is not checked this time", "kind", c.what)
			continue
		}
		if c.after.count == c.want {
			continue
		}
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			cur, err := readKindCount(x.t, c.dir)
			if err != nil || cur != c.after {
				return nil, err // changed since: not exact any more
			}
			if repair {
				if err := x.t.Set(kindBaseKey(c.dir), be64(uint64(int64(c.want)-cur.shards))); err != nil {
					return nil, err
				}
			}
			return problem(fsckCounter, 0, 0, "", repair, "the counter of %s says %d, the namespace holds %d", c.what, c.after.count, c.want), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkInoCounter requires n/next above every inode number, or new
// inodes would overwrite existing ones.
func (f *fscker) checkInoCounter(ctx context.Context) error {
	top := f.scan.maxIno
	if top < f.scan.nextAfter {
		return nil
	}
	return f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
		next, err := getUint64(x.t, keyNextIno)
		if err != nil || next > top {
			return nil, err
		}
		if _, found, err := x.t.Get(inodeKey(top)); err != nil || !found {
			return nil, err
		}
		detail := ""
		if repair {
			// One range more than needed: a meta server may have reserved
			// numbers from the damaged counter (restart the meta servers).
			if err := x.t.Set(keyNextIno, be64(top+1+inoRangeSize)); err != nil {
				return nil, err
			}
			detail = fmt.Sprintf("; set to %d: restart the meta servers so that none keeps numbers reserved from the damaged counter", top+1+inoRangeSize)
		}
		return problem(fsckInoCounter, top, 0, "", repair, "the inode counter n/next is %d but inode %d exists: new files would overwrite existing ones%s", next, top, detail), nil
	})
}

// checkEntries verifies dangling entries, entries in missing directories
// and entry types.
func (f *fscker) checkEntries(ctx context.Context) error {
	for _, e := range f.scan.dangling {
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			ino, _, ok, err := x.entry(e.parent, e.name)
			if err != nil || !ok || ino != e.ino {
				return nil, err
			}
			if _, found, err := x.t.Get(inodeKey(ino)); err != nil || found {
				return nil, err
			}
			if repair {
				if err := x.deleteEntry(e.parent, e.name); err != nil {
					return nil, err
				}
			}
			return problem(fsckDangling, ino, e.parent, e.name, repair, "entry %q in directory %d names inode %d, which does not exist", e.name, e.parent, ino), nil
		})
		if err != nil {
			return err
		}
	}
	for _, e := range f.scan.inMissing {
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			ino, _, ok, err := x.entry(e.parent, e.name)
			if err != nil || !ok || ino != e.ino {
				return nil, err
			}
			d, _, found, err := x.currentInode(e.parent)
			if err != nil || (found && isDir(d.Mode)) {
				return nil, err
			}
			if repair {
				if err := x.deleteEntry(e.parent, e.name); err != nil {
					return nil, err
				}
			}
			return problem(fsckDangling, ino, e.parent, e.name, repair,
				"entry %q naming inode %d is in directory %d, which does not exist or is not a directory (an inode left without names goes to /%s)",
				e.name, ino, e.parent, lostFoundName), nil
		})
		if err != nil {
			return err
		}
	}
	for _, e := range f.scan.mismatched {
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			ino, typ, ok, err := x.entry(e.parent, e.name)
			if err != nil || !ok || ino != e.ino {
				return nil, err
			}
			a, _, found, err := x.currentInode(ino)
			if err != nil || !found || fileType(a.Mode) == typ {
				return nil, err
			}
			if repair {
				if err := x.setEntry(e.parent, e.name, a); err != nil {
					return nil, err
				}
			}
			return problem(fsckTypeMismatch, ino, e.parent, e.name, repair,
				"entry %q in directory %d says type %#o, inode %d has mode %#o (the entry is corrected from the inode)", e.name, e.parent, typ, ino, a.Mode), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkStaleRecords verifies per-inode records whose inode is missing or
// of the wrong type, and orphan records of missing inodes.
func (f *fscker) checkStaleRecords(ctx context.Context) error {
	for _, r := range fsckRecordPrefixes {
		for _, ino := range f.scan.staleRecs[r.what] {
			// Many xattrs go in batches; the problem is reported once.
			for more, first := true, true; more; first = false {
				more = false
				p, err := f.check(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
					more = false
					a, _, found, err := x.currentInode(ino)
					if err != nil || (found && (r.wants == nil || r.wants(a.Mode))) {
						return nil, err
					}
					key := keyWithIno(r.prefix, ino)
					if r.wants == nil {
						key = append(key, '/')
					}
					var keys [][]byte
					err = x.t.Scan(key, kv.PrefixEnd(key), func(k, _ []byte) (bool, error) {
						keys = append(keys, append([]byte(nil), k...))
						return len(keys) < fsckRecordBatch, nil
					})
					if err != nil || len(keys) == 0 {
						return nil, err
					}
					if repair {
						for _, k := range keys {
							if err := x.t.Delete(k); err != nil {
								return nil, err
							}
						}
						more = len(keys) == fsckRecordBatch
					}
					why := "does not exist"
					if found {
						why = fmt.Sprintf("has mode %#o", a.Mode)
					}
					return problem(fsckStaleRecord, ino, 0, "", repair, "%s record of inode %d, which %s", r.what, ino, why), nil
				})
				if err != nil {
					return err
				}
				if p != nil && first {
					f.add(p)
				}
			}
		}
	}
	return nil
}

// checkGCQueue verifies GC queue entries of inodes that exist: damage
// (the GC loop leaves such a file's chunks alone and logs it).
func (f *fscker) checkGCQueue(ctx context.Context) error {
	for ino := range f.scan.gc {
		if _, ok := f.scan.inodes[ino]; !ok {
			continue
		}
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			_, queued, err := x.t.Get(gcKey(ino))
			if err != nil || !queued {
				return nil, err
			}
			if _, found, err := x.t.Get(inodeKey(ino)); err != nil || !found {
				return nil, err
			}
			if repair {
				if err := x.t.Delete(gcKey(ino)); err != nil {
					return nil, err
				}
			}
			return problem(fsckStaleGC, ino, 0, "", repair,
				"inode %d is in the garbage collection queue but still exists (the collector leaves its chunks alone; the queue entry is dropped)", ino), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkOpens verifies open records of sessions that no longer exist or
// of inodes that no longer exist, and the two indexes of open records
// against each other.
func (f *fscker) checkOpens(ctx context.Context) error {
	sc := f.scan
	var refs []openRef
	seen := map[openRef]bool{}
	for _, o := range sc.opens {
		seen[o] = true
		_, inodeOK := sc.inodes[o.ino]
		if !sc.sessions[o.session] || !inodeOK || !sc.sessOpens[o] {
			refs = append(refs, o)
		}
	}
	for o := range sc.sessOpens {
		if !seen[o] {
			refs = append(refs, o)
		}
	}
	for _, o := range refs {
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			_, hasOpen, err := x.t.Get(openKey(o.ino, o.session))
			if err != nil {
				return nil, err
			}
			_, hasIndex, err := x.t.Get(sessionOpenKey(o.session, o.ino))
			if err != nil || (!hasOpen && !hasIndex) {
				return nil, err
			}
			_, live, err := x.t.Get(sessionKey(o.session))
			if err != nil {
				return nil, err
			}
			a, _, found, err := x.currentInode(o.ino)
			if err != nil {
				return nil, err
			}
			if live && found {
				if hasOpen && hasIndex {
					return nil, nil
				}
				// Only one of the two records: the session's end would miss
				// the open (or find nothing to drop). Make them agree.
				if repair {
					if hasOpen {
						err = x.t.Set(sessionOpenKey(o.session, o.ino), nil)
					} else {
						err = x.t.Delete(sessionOpenKey(o.session, o.ino))
					}
					if err != nil {
						return nil, err
					}
				}
				return problem(fsckStaleOpen, o.ino, 0, "", repair, "open of inode %d by session %s is recorded under n/o/ %v and under n/so/ %v (the indexes must agree)",
					o.ino, o.session, hasOpen, hasIndex), nil
			}
			why := fmt.Sprintf("session %s no longer exists", o.session)
			if !found {
				why = fmt.Sprintf("inode %d no longer exists", o.ino)
			}
			detail := ""
			if repair {
				if found {
					orphan := sc.orphans[o.ino] || a.Nlink == 0
					if err := x.dropOpen(o.session, o.ino); err != nil {
						return nil, err
					}
					if _, still, err := x.t.Get(inodeKey(o.ino)); err == nil && !still && orphan {
						detail = "; it was the last open of an unlinked file, which was deleted"
					}
				} else {
					for _, k := range [][]byte{openKey(o.ino, o.session), sessionOpenKey(o.session, o.ino), orphanKey(o.ino)} {
						if err := x.t.Delete(k); err != nil {
							return nil, err
						}
					}
				}
			}
			return problem(fsckStaleOpen, o.ino, 0, "", repair, "open record of inode %d by session %s, but %s%s", o.ino, o.session, why, detail), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkOrphanRecords verifies orphan records (n/or/) of inodes that are
// missing or still have names: releasing such an inode would delete a
// linked file.
func (f *fscker) checkOrphanRecords(ctx context.Context) error {
	for ino := range f.scan.orphans {
		if _, ok := f.scan.inodes[ino]; ok && f.scan.refs[ino] == 0 {
			continue
		}
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			if _, rec, err := x.t.Get(orphanKey(ino)); err != nil || !rec {
				return nil, err
			}
			a, same, err := f.unchanged(x, ino)
			if err != nil {
				return nil, err
			}
			why := "does not exist"
			switch {
			case a != nil && same:
				why = fmt.Sprintf("still has %d name(s)", f.scan.refs[ino])
			case a != nil:
				return nil, nil // changed since the scan: look again next time
			}
			if repair {
				if err := x.t.Delete(orphanKey(ino)); err != nil {
					return nil, err
				}
			}
			return problem(fsckOrphanRecord, ino, 0, "", repair, "inode %d is recorded as unlinked-but-open but %s (its last close would delete it)", ino, why), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// keptName is the name a directory keeps when it has several: the one in
// the directory its parent record names, else the first.
func (f *fscker) keptName(dir uint64) (entryRef, bool) {
	names := f.scan.dirNames[dir]
	if len(names) == 0 {
		return entryRef{}, false
	}
	p, ok := f.scan.parents[dir]
	if ok {
		for _, e := range names {
			if e.parent == p {
				return e, true
			}
		}
	}
	return names[0], true
}

// wantNlink is the link count inode ino should have by the scan: its
// names for a non-directory, 2 + its subdirectories for a directory
// (counting each subdirectory once, by the name it keeps).
func (f *fscker) wantNlink(subdirs map[uint64]uint32, ino uint64, in scanInode) uint32 {
	if isDir(in.mode) {
		return 2 + subdirs[ino]
	}
	return f.scan.refs[ino]
}

// checkNlinks verifies link counts whose inode did not change since the
// scan read it (so its names, or a directory's entries, did not change
// during the entry scan either).
func (f *fscker) checkNlinks(ctx context.Context) error {
	subdirs := map[uint64]uint32{}
	for dir := range f.scan.dirNames {
		if e, ok := f.keptName(dir); ok {
			subdirs[e.parent]++
		}
	}
	for _, ino := range sortedInos(f.scan.inodes) {
		in := f.scan.inodes[ino]
		want := f.wantNlink(subdirs, ino, in)
		if in.nlink == want || (!isDir(in.mode) && want == 0) {
			continue // names counted 0: an orphan, checked later
		}
		var newFP uint64
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			newFP = 0
			a, same, err := f.unchanged(x, ino)
			if err != nil || !same {
				return nil, err
			}
			had := a.Nlink
			if repair {
				a.Nlink = want
				v, err := proto.Marshal(a)
				if err != nil {
					return nil, err
				}
				if err := x.t.Set(inodeKey(ino), v); err != nil {
					return nil, err
				}
				newFP = fingerprint(v)
			}
			return problem(fsckNlink, ino, 0, "", repair, "inode %d (mode %#o) has link count %d, should be %d", ino, a.Mode, had, want), nil
		})
		if err != nil {
			return err
		}
		if newFP != 0 {
			// The later checks of this inode compare with what fsck wrote.
			in.fp = newFP
			f.scan.inodes[ino] = in
		}
	}
	for dir, names := range f.scan.dirNames {
		kept, _ := f.keptName(dir)
		for _, e := range names {
			if e == kept {
				continue
			}
			err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
				if _, same, err := f.unchanged(x, dir); err != nil || !same {
					return nil, err
				}
				ino, _, ok, err := x.entry(e.parent, e.name)
				if err != nil || !ok || ino != dir {
					return nil, err
				}
				if repair {
					if err := x.deleteEntry(e.parent, e.name); err != nil {
						return nil, err
					}
				}
				return problem(fsckExtraDirEntry, dir, e.parent, e.name, repair,
					"directory %d also has the name %q in directory %d; it keeps %q in directory %d", dir, e.name, e.parent, kept.name, kept.parent), nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// checkParents verifies the parent records of directories against the
// entry naming them.
func (f *fscker) checkParents(ctx context.Context) error {
	for dir := range f.scan.dirNames {
		kept, _ := f.keptName(dir)
		if p, ok := f.scan.parents[dir]; ok && p == kept.parent {
			continue
		}
		err := f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			if _, same, err := f.unchanged(x, dir); err != nil || !same {
				return nil, err
			}
			ino, _, ok, err := x.entry(kept.parent, kept.name)
			if err != nil || !ok || ino != dir {
				return nil, err
			}
			v, has, err := x.t.Get(parentKey(dir))
			if err != nil {
				return nil, err
			}
			what := "no parent record"
			if has {
				p, _ := inoFromKeySuffix(v)
				if len(v) == 8 && p == kept.parent {
					return nil, nil
				}
				what = fmt.Sprintf("parent record %d", p)
			}
			if repair {
				if err := x.t.Set(parentKey(dir), be64(kept.parent)); err != nil {
					return nil, err
				}
				if err := x.bumpLayoutGen(); err != nil {
					return nil, err
				}
			}
			return problem(fsckParent, dir, kept.parent, kept.name, repair, "directory %d (%q in directory %d) has %s", dir, kept.name, kept.parent, what), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkSymlinks verifies that every symbolic link has its target. A lost
// target cannot be rebuilt: the link is reported, not repaired.
func (f *fscker) checkSymlinks(ctx context.Context) error {
	for _, ino := range sortedInos(f.scan.inodes) {
		if !isLink(f.scan.inodes[ino].mode) || f.scan.symlinks[ino] {
			continue
		}
		err := f.verify(ctx, func(x *tx, _ bool) (*weftv1.FsckProblem, error) {
			a, _, found, err := x.currentInode(ino)
			if err != nil || !found || !isLink(a.Mode) {
				return nil, err
			}
			if _, has, err := x.t.Get(symlinkKey(ino)); err != nil || has {
				return nil, err
			}
			return problem(fsckNoTarget, ino, 0, "", false, "symbolic link %d has no target record; remove the link and make it again", ino), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// sortedInos returns the keys of m in order, so that reports are stable.
func sortedInos[V any](m map[uint64]V) []uint64 {
	out := make([]uint64, 0, len(m))
	for ino := range m {
		out = append(out, ino)
	}
	slices.Sort(out)
	return out
}
