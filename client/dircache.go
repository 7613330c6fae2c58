package client

import (
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Limits of the complete-directory cache.
const (
	// maxCompleteDirs is how many directories are known completely.
	maxCompleteDirs = 4096
	// maxCompleteNames bounds the names held over all of them; a
	// directory that would pass it is not (or no longer) known
	// completely.
	maxCompleteNames = 1 << 20
	// maxDirNames bounds the names of one directory known completely.
	maxDirNames = 1 << 16
	// dirChangeRing is how many recent directory changes are kept to
	// tell whether a directory changed while a request about it ran.
	dirChangeRing = 4096
)

// dirChange is one change of a directory (a callback about it, or a
// change this client made or could not account for).
type dirChange struct {
	seq uint64
	dir uint64
}

// dirCache knows the complete contents (names only) of directories this
// client made or listed completely while the meta service's callbacks
// reach it, so that a lookup of a name that does not exist there is
// answered without a call (see README.md "Complete directories").
type dirCache struct {
	mu     sync.Mutex
	seq    uint64 // counts changes
	allSeq uint64 // seq of the last "drop everything"
	ring   [dirChangeRing]dirChange
	dirs   map[uint64]map[string]struct{}
	names  int // over all of dirs
	// attrs holds directories' attributes (at most maxCompleteDirs),
	// kept like their names: the kernel asks for a directory's
	// attributes again after every create in it.
	attrs map[uint64]*weftv1.Attr
	// files and entries hold regular files' attributes (filecache.go);
	// fileGen counts dropFiles calls; release sends the Forget of a
	// file the kernel forgot once it leaves them.
	files     map[uint64]*cachedFile
	entries   map[entryKey]uint64
	forgotten map[uint64]struct{} // kept files the kernel forgot
	fileGen   uint64
	release   func(inos ...uint64)

	hits     atomic.Uint64 // lookups answered from here
	attrHits atomic.Uint64 // getattrs answered from here
	fileHits atomic.Uint64 // lookups and getattrs of files answered from here
}

// token returns a mark to pass to complete: a directory is only recorded
// as complete if nothing changed it since its token was taken.
func (d *dirCache) token() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq
}

// changedLocked reports whether dir changed (or might have) since tok.
func (d *dirCache) changedLocked(dir, tok uint64) bool {
	if d.allSeq > tok {
		return true
	}
	if d.seq-tok >= dirChangeRing {
		return true // the ring no longer reaches back to tok
	}
	for s := d.seq; s > tok; s-- {
		if d.ring[s%dirChangeRing].dir == dir {
			return true
		}
	}
	return false
}

// noteLocked records a change of dir and forgets its contents.
func (d *dirCache) noteLocked(dir uint64) {
	d.seq++
	d.ring[d.seq%dirChangeRing] = dirChange{seq: d.seq, dir: dir}
	if names, ok := d.dirs[dir]; ok {
		d.names -= len(names)
		delete(d.dirs, dir)
	}
	delete(d.attrs, dir)
	d.dropFileLocked(dir)
}

// changed records that dirs changed in ways this client does not know
// (a callback, a failed call, a forgotten inode).
func (d *dirCache) changed(dirs ...uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dir := range dirs {
		d.noteLocked(dir)
	}
}

// dropAttrs forgets every directory's attributes (after a change of this
// client to a directory it cannot name).
func (d *dirCache) dropAttrs() {
	d.mu.Lock()
	clear(d.attrs)
	d.mu.Unlock()
}

// dropAttrsBut forgets every directory's attributes but those of keep.
func (d *dirCache) dropAttrsBut(keep ...uint64) {
	d.mu.Lock()
	for ino := range d.attrs {
		if !slices.Contains(keep, ino) {
			delete(d.attrs, ino)
		}
	}
	d.mu.Unlock()
}

// dropAttrsOfEmptyBut forgets the attributes of every directory that may
// be the one a removal in keep just removed: every one but keep, those
// with subdirectories (link count over 2) and those known to hold names.
func (d *dirCache) dropAttrsOfEmptyBut(keep uint64) {
	d.mu.Lock()
	for ino, a := range d.attrs {
		if ino != keep && a.Nlink <= 2 && len(d.dirs[ino]) == 0 {
			delete(d.attrs, ino)
		}
	}
	d.mu.Unlock()
}

// dropAll forgets every directory (callbacks may have been missed).
func (d *dirCache) dropAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	d.allSeq = d.seq
	clear(d.dirs)
	clear(d.attrs)
	d.names = 0
	d.dropFilesLocked()
}

// complete records that names are all of dir's entries, as read by a
// request that started at tok; it does nothing if dir changed since.
func (d *dirCache) complete(dir, tok uint64, names []string) {
	if len(names) > maxDirNames {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.changedLocked(dir, tok) {
		return
	}
	if old, ok := d.dirs[dir]; ok {
		d.names -= len(old)
		delete(d.dirs, dir)
	}
	// Make room: any directory may go (they are all cheap to relearn).
	for k, v := range d.dirs {
		if len(d.dirs) < maxCompleteDirs && d.names+len(names) <= maxCompleteNames {
			break
		}
		d.names -= len(v)
		delete(d.dirs, k)
	}
	if d.dirs == nil {
		d.dirs = make(map[uint64]map[string]struct{})
	}
	set := make(map[string]struct{}, len(names))
	for _, n := range names {
		set[n] = struct{}{}
	}
	d.dirs[dir] = set
	d.names += len(set)
}

// add records that this client made name in dir. Every change of this
// client counts as a change of dir, so that a listing running meanwhile
// is not taken as complete. With created, the change was the creation of
// a new regular file whose ctime is ctimeNs: dir's mtime and ctime
// became that and nothing else of it changed.
func (d *dirCache) add(dir uint64, name string, created bool, ctimeNs int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	d.ring[d.seq%dirChangeRing] = dirChange{seq: d.seq, dir: dir}
	if !created {
		delete(d.attrs, dir) // its nlink, size or times changed
	} else {
		d.touchLocked(dir, ctimeNs)
	}
	d.setNameLocked(dir, name, true)
}

// removeKnown records that this client removed the regular file ino,
// name in dir, at ctimeNs (answered under a delegation): dir's mtime and
// ctime became that, the name leaves dir's complete name set (if dir is
// known completely) and the file's kept attributes go. It does nothing
// and reports false unless name is dir's kept entry for ino.
func (d *dirCache) removeKnown(dir uint64, name string, ino uint64, ctimeNs int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ino == 0 || d.entries[entryKey{dir, name}] != ino {
		return false
	}
	d.seq++
	d.ring[d.seq%dirChangeRing] = dirChange{seq: d.seq, dir: dir}
	d.touchLocked(dir, ctimeNs)
	d.setNameLocked(dir, name, false)
	d.dropFileLocked(ino)
	return true
}

// touchLocked sets the mtime and ctime of dir's recorded attributes (a
// copy: readers hold the old one) to timeNs.
func (d *dirCache) touchLocked(dir uint64, timeNs int64) {
	if a := d.attrs[dir]; a != nil {
		a = proto.Clone(a).(*weftv1.Attr)
		a.MtimeNs, a.CtimeNs = timeNs, timeNs
		d.attrs[dir] = a
	}
}

// setNameLocked adds (added) or removes name in dir's complete name set,
// if dir has one; a set that would grow past the bounds is dropped.
func (d *dirCache) setNameLocked(dir uint64, name string, added bool) {
	set, ok := d.dirs[dir]
	if !ok {
		return
	}
	_, had := set[name]
	switch {
	case !added && had:
		delete(set, name)
		d.names--
	case added && !had:
		if len(set) >= maxDirNames || d.names >= maxCompleteNames {
			d.names -= len(set)
			delete(d.dirs, dir)
			return
		}
		set[name] = struct{}{}
		d.names++
	}
}

// entryChange is one name this client added (added) or removed in dir,
// with dir's attributes as the call's answer gave them (parent, or nil).
type entryChange struct {
	dir    uint64
	name   string
	added  bool
	parent *weftv1.Attr
}

// changeEntries records the changes of one call of this client started
// at tok: each dir's attributes from the answer are kept unless the
// directory changed meanwhile for another reason (else they are dropped,
// as the change altered them), and its complete name set follows.
func (d *dirCache) changeEntries(tok uint64, changes ...entryChange) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fresh := make([]bool, len(changes))
	for i, ch := range changes {
		fresh[i] = ch.parent != nil && ch.parent.Ino == ch.dir && !d.changedLocked(ch.dir, tok)
	}
	for i, ch := range changes {
		d.seq++
		d.ring[d.seq%dirChangeRing] = dirChange{seq: d.seq, dir: ch.dir}
		if fresh[i] {
			d.putAttrLocked(ch.parent)
		} else {
			delete(d.attrs, ch.dir)
		}
		d.setNameLocked(ch.dir, ch.name, ch.added)
	}
}

// putAttr records a directory's attributes read by a request started at
// tok, unless it changed since.
func (d *dirCache) putAttr(a *weftv1.Attr, tok uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.changedLocked(a.Ino, tok) {
		return
	}
	d.putAttrLocked(a)
}

func (d *dirCache) putAttrLocked(a *weftv1.Attr) {
	if d.attrs == nil {
		d.attrs = make(map[uint64]*weftv1.Attr)
	}
	for k := range d.attrs {
		if len(d.attrs) < maxCompleteDirs {
			break
		}
		delete(d.attrs, k)
	}
	d.attrs[a.Ino] = proto.Clone(a).(*weftv1.Attr)
}

// attr returns a copy of a directory's recorded attributes, nil if none.
func (d *dirCache) attr(ino uint64) *weftv1.Attr {
	d.mu.Lock()
	a := d.attrs[ino]
	d.mu.Unlock()
	if a == nil {
		return nil
	}
	return proto.Clone(a).(*weftv1.Attr)
}

// missing reports whether name is known not to exist in dir.
func (d *dirCache) missing(dir uint64, name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	set, ok := d.dirs[dir]
	if !ok {
		return false
	}
	_, had := set[name]
	return !had
}

// known reports whether dir's names are known completely.
func (d *dirCache) known(dir uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.dirs[dir]
	return ok
}

// invalidate applies a callback of the meta service.
func (d *dirCache) invalidate(inv *weftv1.Invalidation) {
	if inv.All {
		d.dropAll()
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ino := range inv.Inodes {
		d.noteLocked(ino)
	}
	for _, e := range inv.Entries {
		d.noteLocked(e.Parent)
		d.dropEntryLocked(e.Parent, e.Name)
	}
}

// dirToken returns a token of the complete-directory cache, or 0 when
// callbacks are off (then nothing is recorded).
func (c *Client) dirToken() (uint64, bool) {
	if !c.cb.on.Load() || !c.cb.live.Load() {
		return 0, false
	}
	return c.dirs.token(), true
}

// dirComplete records dir's complete contents read by a request started
// at tok, if callbacks were live throughout.
func (c *Client) dirComplete(dir, tok uint64, names []string) {
	if c.cb.live.Load() {
		c.dirs.complete(dir, tok, names)
	}
}

// knownMissing reports whether name is known not to exist in dir: dir's
// contents are known completely and callbacks reach this client.
func (c *Client) knownMissing(dir uint64, name string) bool {
	// A name too long is the meta service's to refuse (ENAMETOOLONG).
	if len(name) > maxNameLen || !c.cb.live.Load() || !c.dirs.missing(dir, name) {
		return false
	}
	c.dirs.hits.Add(1)
	return true
}

// errKnownMissing answers a lookup from the complete-directory cache.
// The message is formatted only when asked for: a create looks its name
// up first, so this is on every create's path, and the mount only needs
// the errno.
func errKnownMissing(dir uint64, name string) error {
	return &knownMissingError{dir: dir, name: name}
}

// knownMissingError is ENOENT from the complete-directory cache; it reads
// as fserr.Wrap(syscall.ENOENT, ...) would.
type knownMissingError struct {
	dir  uint64
	name string
}

func (e *knownMissingError) Error() string {
	return fserr.Wrap(syscall.ENOENT, "lookup %q in directory %d: no such file or directory", e.name, e.dir).Error()
}

func (e *knownMissingError) Unwrap() error { return syscall.ENOENT }

// noteMade records the outcome of a call of this client that makes name
// in dir: on success the name exists; on failure the directory is no
// longer known completely (the name may exist, or the call may have
// happened without an answer).
func (c *Client) noteMade(dir uint64, name string, err error) {
	c.noteEntry(dir, name, true, err, nil, 0, false)
}

// noteEntry records the outcome of a call of this client started at tok
// (track: with callbacks live) that added (added) or removed name in dir;
// parent is dir's attributes as the call's answer gave them.
func (c *Client) noteEntry(dir uint64, name string, added bool, err error, parent *weftv1.Attr, tok uint64, track bool) {
	c.noteEntries(err, tok, track, entryChange{dir: dir, name: name, added: added, parent: parent})
}

// noteEntries records the outcome of a call of this client started at tok
// (track: with callbacks live) that made changes.
func (c *Client) noteEntries(err error, tok uint64, track bool, changes ...entryChange) {
	if !c.cb.on.Load() {
		return
	}
	if err != nil {
		for _, ch := range changes {
			c.dirs.changed(ch.dir)
		}
		return
	}
	if !track || !c.cb.live.Load() {
		for i := range changes {
			changes[i].parent = nil
		}
	}
	c.dirs.changeEntries(tok, changes...)
}

// noteAttrChange records that this client changed inode ino's
// attributes (setattr, xattrs): the meta service does not call it back.
func (c *Client) noteAttrChange(ino uint64) {
	if c.cb.on.Load() {
		c.dirs.changed(ino)
	}
}

// noteCreated records a Create of this client in dir that succeeded:
// created says whether it made a new file (attr), or opened one that
// existed.
func (c *Client) noteCreated(dir uint64, name string, created bool, attr *weftv1.Attr) {
	if c.cb.on.Load() {
		c.dirs.add(dir, name, created, attr.GetCtimeNs())
	}
}

// noteDirAttr records fresh attributes of a directory read by a request
// started at tok (callbacks live throughout).
func (c *Client) noteDirAttr(a *weftv1.Attr, tok uint64) {
	if a != nil && a.Mode&syscall.S_IFMT == syscall.S_IFDIR && c.cb.live.Load() {
		c.dirs.putAttr(a, tok)
	}
}

// cachedDirAttr returns a directory's attributes if they are known and
// callbacks are live: the meta service calls back when they change.
func (c *Client) cachedDirAttr(ino uint64) *weftv1.Attr {
	if !c.cb.live.Load() {
		return nil
	}
	a := c.dirs.attr(ino)
	if a != nil {
		c.dirs.attrHits.Add(1)
	}
	return a
}

// LocalLookups returns how many lookups of missing names were answered
// from the complete-directory cache without a call.
func (c *Client) LocalLookups() uint64 { return c.dirs.hits.Load() }
