package client

import (
	"syscall"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Regular files' attributes under callbacks (README.md "Files' attributes
// under callbacks"). A lookup of a regular file answered by the meta
// service while callbacks are live is kept: the entry (directory, name)
// and the file's attributes. The meta service calls this session back
// when either changes through another session, so a later lookup of the
// same name, or a getattr of the file, is answered here. The kernel
// forgetting the file (a page-cache drop, memory pressure) does not
// forget it here: its Forget to the meta service waits until the entry
// leaves this cache, so the callbacks keep coming meanwhile. What ends an
// entry: a callback naming the file or the entry, any callback that asks
// to drop everything (or the stream breaking), this client changing the
// namespace or any attributes itself (setattr, write commits, creates,
// removals, renames, links, xattrs: the meta service does not call a
// session back for its own changes, so every cached file goes), and
// eviction past maxCachedFiles.

// maxCachedFiles bounds the files whose attributes are kept (and whose
// callbacks the meta service keeps sending after the kernel forgot them).
const maxCachedFiles = 1 << 16

// entryKey names a directory entry.
type entryKey struct {
	dir  uint64
	name string
}

// cachedFile is a regular file's attributes as the meta service answered
// a lookup of it.
type cachedFile struct {
	attr  *weftv1.Attr
	entry entryKey
	// forgotten: the kernel forgot the file; its Forget goes to the meta
	// service when the entry leaves the cache.
	forgotten bool
}

// fileGeneration returns the count of dropFiles calls, for putFile.
func (d *dirCache) fileGeneration() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fileGen
}

// putFile keeps a regular file's attributes and the entry that named it,
// as read by a lookup started at tok and gen (fileGeneration), unless the
// file or the directory changed since, or this client changed anything
// since.
func (d *dirCache) putFile(dir uint64, name string, a *weftv1.Attr, tok, gen uint64) {
	if a == nil || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != d.fileGen || d.changedLocked(a.Ino, tok) || d.changedLocked(dir, tok) {
		return
	}
	d.putFileLocked(dir, name, a)
}

// putCreated keeps the attributes of a regular file a Create of this
// client, started at tok, just made or opened as name in dir (replacing
// what was kept of it), unless the file changed since (a callback): the
// answer registered this session's interest in it, and the kernel does
// not know the file yet, so nothing else of this client can have changed
// it. A Create changes no other file: it passes keepFiles.
func (d *dirCache) putCreated(dir uint64, name string, a *weftv1.Attr, tok uint64) {
	if a == nil || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.changedLocked(a.Ino, tok) {
		d.putFileLocked(dir, name, a)
	}
}

// dropEntry forgets the file kept under name in dir, if any.
func (d *dirCache) dropEntry(dir uint64, name string) {
	d.mu.Lock()
	d.dropEntryLocked(dir, name)
	d.mu.Unlock()
}

// dropFile forgets the kept attributes of file ino, if any.
func (d *dirCache) dropFile(ino uint64) {
	d.mu.Lock()
	d.dropFileLocked(ino)
	d.mu.Unlock()
}

// putMade keeps the attributes of a file this client made under a
// delegation, as the meta service stored it (the answer registered this
// session's interest in it). Nothing of this client can have changed it
// meanwhile: its calls about the file wait for the answer.
func (d *dirCache) putMade(dir uint64, name string, a *weftv1.Attr) {
	if a == nil || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.putFileLocked(dir, name, a)
}

func (d *dirCache) putFileLocked(dir uint64, name string, a *weftv1.Attr) {
	if d.files == nil {
		d.files = make(map[uint64]*cachedFile)
		d.entries = make(map[entryKey]uint64)
	}
	key := entryKey{dir, name}
	if old := d.files[a.Ino]; old != nil {
		delete(d.entries, old.entry)
		old.entry, old.attr = key, proto.Clone(a).(*weftv1.Attr)
		d.setForgottenLocked(a.Ino, old, false)
		d.entries[key] = a.Ino
		return
	}
	if other, ok := d.entries[key]; ok {
		d.dropFileLocked(other)
	}
	for ino := range d.files {
		if len(d.files) < maxCachedFiles {
			break
		}
		d.dropFileLocked(ino)
	}
	d.files[a.Ino] = &cachedFile{attr: proto.Clone(a).(*weftv1.Attr), entry: key}
	d.entries[key] = a.Ino
}

// file returns a copy of the attributes of the file name in dir, nil if
// not kept. The kernel holds the file again: its Forget no longer waits.
func (d *dirCache) file(dir uint64, name string) *weftv1.Attr {
	d.mu.Lock()
	defer d.mu.Unlock()
	ino, ok := d.entries[entryKey{dir, name}]
	if !ok {
		return nil
	}
	f := d.files[ino]
	if f == nil {
		delete(d.entries, entryKey{dir, name})
		return nil
	}
	d.setForgottenLocked(ino, f, false)
	return proto.Clone(f.attr).(*weftv1.Attr)
}

// fileAttr returns a copy of a kept file's attributes, nil if none.
func (d *dirCache) fileAttr(ino uint64) *weftv1.Attr {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.files[ino]
	if f == nil {
		return nil
	}
	return proto.Clone(f.attr).(*weftv1.Attr)
}

// held notes that ino was handed to the kernel again (a reply about it):
// its Forget no longer waits.
func (d *dirCache) held(ino uint64) {
	d.mu.Lock()
	if f := d.files[ino]; f != nil {
		d.setForgottenLocked(ino, f, false)
	}
	d.mu.Unlock()
}

// forgetFile notes that the kernel forgot ino; it reports whether ino is
// a kept file, whose Forget then waits until it leaves the cache.
func (d *dirCache) forgetFile(ino uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.files[ino]
	if f == nil {
		return false
	}
	d.setForgottenLocked(ino, f, true)
	return true
}

// dropFiles forgets every kept file (this client changed something the
// meta service will not call it back about); lookups started before are
// not recorded.
func (d *dirCache) dropFiles() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fileGen++
	d.dropFilesLocked()
}

// hasFiles reports whether any file is kept.
func (d *dirCache) hasFiles() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.files) > 0
}

// dropFilesLocked forgets every kept file at once (new maps rather than
// a delete per file: a change of this client drops them all, and there
// may be many), releasing the Forgets of those the kernel forgot.
func (d *dirCache) dropFilesLocked() {
	if len(d.files) == 0 {
		return
	}
	var released []uint64
	for ino := range d.forgotten {
		released = append(released, ino)
	}
	d.files, d.entries, d.forgotten = nil, nil, nil
	if len(released) > 0 && d.release != nil {
		d.release(released...)
	}
}

// dropFileLocked forgets a kept file; if the kernel forgot it too, its
// Forget goes to the meta service now.
func (d *dirCache) dropFileLocked(ino uint64) {
	f := d.files[ino]
	if f == nil {
		return
	}
	delete(d.files, ino)
	delete(d.entries, f.entry)
	if f.forgotten {
		delete(d.forgotten, ino)
		if d.release != nil {
			d.release(ino)
		}
	}
}

// setForgottenLocked marks f (the kept file ino) forgotten by the kernel
// or not.
func (d *dirCache) setForgottenLocked(ino uint64, f *cachedFile, forgotten bool) {
	if f.forgotten == forgotten {
		return
	}
	f.forgotten = forgotten
	if !forgotten {
		delete(d.forgotten, ino)
		return
	}
	if d.forgotten == nil {
		d.forgotten = make(map[uint64]struct{})
	}
	d.forgotten[ino] = struct{}{}
}

// dropEntryLocked forgets the file kept under an entry a callback named.
func (d *dirCache) dropEntryLocked(dir uint64, name string) {
	if ino, ok := d.entries[entryKey{dir, name}]; ok {
		d.dropFileLocked(ino)
	}
}

// clearsFileAttrs holds the meta calls of this client after which no kept
// file's attributes can be trusted (the meta service does not call its
// own session back): those whose call option says changes.
var clearsFileAttrs = func() map[string]bool {
	m := make(map[string]bool)
	for _, c := range weftv1.MetaCalls() {
		if c.Changes {
			m[c.Name] = true
		}
	}
	return m
}()

// cachedFileAttr returns the attributes of the regular file name in dir
// if they are kept and callbacks are live.
func (c *Client) cachedFileAttr(dir uint64, name string) *weftv1.Attr {
	if !c.cb.live.Load() {
		return nil
	}
	a := c.dirs.file(dir, name)
	if a != nil {
		c.dirs.fileHits.Add(1)
	}
	return a
}

// cachedFileAttrOf returns the kept attributes of the regular file ino if
// callbacks are live.
func (c *Client) cachedFileAttrOf(ino uint64) *weftv1.Attr {
	if !c.cb.live.Load() {
		return nil
	}
	a := c.dirs.fileAttr(ino)
	if a != nil {
		c.dirs.fileHits.Add(1)
	}
	return a
}

// ownSession reports whether caller carries this client's session: the
// meta service registers callback interest for what it answers it.
func (c *Client) ownSession(caller *weftv1.Caller) bool {
	s := caller.GetSession()
	return s != "" && s == c.Session()
}

// FileAttrHits reports how many lookups and getattrs of regular files
// were answered from kept attributes without a call.
func (c *Client) FileAttrHits() uint64 { return c.dirs.fileHits.Load() }
