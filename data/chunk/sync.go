package chunk

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"time"
)

// What is durable.
//
// A target keeps, for every chunk written since it was last synced, the
// version of its last write and the version it was last synced at (the
// synced floor): a block's copy written at or before the floor is on
// stable storage, one written after it may be lost or torn by a power
// loss. A chunk with no such record is durable whole: the target syncs
// its file system when it opens (what an earlier run left in the page
// cache goes to the disk), and a record goes only once a sync covered
// the chunk's last write. The floor decides where a write may go
// (write.go) and, written into the chunk file after each sync, which
// copies a recovery after a crash must check (chunkfile.go).
type syncState struct {
	written uint64    // version of the last write
	synced  uint64    // version durable at the last sync
	at      time.Time // when the last write was
}

// noteWrite records a write of chunk id as version; prev is its version
// before.
func (t *Target) noteWrite(id ID, prev, version uint64) {
	t.syncMu.Lock()
	defer t.syncMu.Unlock()
	m := t.unsynced[id.Ino]
	if m == nil {
		m = make(map[uint64]*syncState)
		t.unsynced[id.Ino] = m
	}
	st := m[id.Index]
	if st == nil {
		st = &syncState{synced: prev}
		m[id.Index] = st
	}
	st.written, st.at = version, time.Now()
}

// syncedFloor returns the version chunk id is durable at (noFloor if
// nothing of it is unsynced).
func (t *Target) syncedFloor(id ID) uint64 {
	t.syncMu.Lock()
	defer t.syncMu.Unlock()
	if st := t.unsynced[id.Ino][id.Index]; st != nil {
		return st.synced
	}
	return noFloor
}

// unsyncedHas reports that chunk id was written since its last sync by
// this run of the server.
func (t *Target) unsyncedHas(id ID) bool {
	t.syncMu.Lock()
	defer t.syncMu.Unlock()
	return t.unsynced[id.Ino][id.Index] != nil
}

// noteSynced records that a sync of chunk id covered its writes up to
// version v. With was set, only if the chunk's record is still was (not
// one of a chunk removed and made anew meanwhile).
func (t *Target) noteSynced(id ID, v uint64, was *syncState) {
	t.syncMu.Lock()
	defer t.syncMu.Unlock()
	m := t.unsynced[id.Ino]
	st := m[id.Index]
	if st == nil || was != nil && st != was {
		return
	}
	if st.written <= v {
		delete(m, id.Index)
		if len(m) == 0 {
			delete(t.unsynced, id.Ino)
		}
		return
	}
	st.synced = max(st.synced, v)
}

// clearUnsynced forgets chunk id's record (it was removed or replaced
// durably).
func (t *Target) clearUnsynced(id ID) {
	t.syncMu.Lock()
	defer t.syncMu.Unlock()
	if m := t.unsynced[id.Ino]; m != nil {
		delete(m, id.Index)
		if len(m) == 0 {
			delete(t.unsynced, id.Ino)
		}
	}
}

// syncLocked fdatasyncs chunk f, held by the caller, and records it.
func (t *Target) syncLocked(f *chunkFile) error {
	id := f.key.id
	if err := f.file.Datasync(); err != nil {
		return t.ioError(fmt.Sprintf("sync %v", id), err)
	}
	t.writeSynced(f.file, id, f.hdr.version)
	t.noteSynced(id, f.hdr.version, nil)
	return nil
}

// SyncFile makes every chunk of ino written on this target since its last
// sync durable: fdatasync of the chunk files, then fsync of the directories
// that got new entries.
//
// It takes no chunk lock (a write holding its chunk while it forwards, or
// an empty write with sync, calls it), so it never touches the cache of
// open files: their fields are used only under the chunk's lock, and a
// mutation may close (truncate, delete, Replace) them meanwhile. It opens
// the chunk files by path instead; fdatasync of any descriptor of a file
// flushes what was written through every other.
func (t *Target) SyncFile(ino uint64) error {
	type todo struct {
		id ID
		st *syncState
		v  uint64
	}
	t.syncMu.Lock()
	var todos []todo
	for idx, st := range t.unsynced[ino] {
		todos = append(todos, todo{ID{Ino: ino, Index: idx}, st, st.written})
	}
	t.syncMu.Unlock()
	slices.SortFunc(todos, func(a, b todo) int { return cmp.Compare(a.id.Index, b.id.Index) })
	for _, c := range todos {
		if err := t.syncByPath(c.id, c.v, c.st); err != nil {
			return err
		}
	}
	return t.syncEntries(ino)
}

// syncAll syncs every chunk of the target written since its last sync.
func (t *Target) syncAll() error { return t.SyncIdle(0) }

// SyncIdle syncs the chunks last written more than age ago and not
// synced since. The kernel writes such chunks back by itself (after 30 s
// by default), so the sync is cheap; it bounds the chunks the target
// keeps records of, and what a restart must recover.
func (t *Target) SyncIdle(age time.Duration) error {
	t.syncMu.Lock()
	var inos []uint64
	now := time.Now()
	for ino, m := range t.unsynced {
		for _, st := range m {
			if now.Sub(st.at) >= age {
				inos = append(inos, ino)
				break
			}
		}
	}
	t.syncMu.Unlock()
	slices.Sort(inos)
	for _, ino := range inos {
		if err := t.SyncFile(ino); err != nil {
			return err
		}
	}
	return nil
}

// syncByPath fdatasyncs chunk id's file through a descriptor of its own,
// covering its writes up to version v (st being its record then). A
// chunk removed meanwhile has nothing left to sync; one replaced
// meanwhile was synced by Replace.
func (t *Target) syncByPath(id ID, v uint64, st *syncState) error {
	file, err := t.fs.OpenFile(t.inlinePath(id), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return t.ioError(fmt.Sprintf("open %v for sync", id), err)
	}
	defer file.Close()
	if err := file.Datasync(); err != nil {
		return t.ioError(fmt.Sprintf("sync %v", id), err)
	}
	t.syncMu.Lock()
	same := t.unsynced[id.Ino][id.Index] == st
	t.syncMu.Unlock()
	if same {
		t.writeSynced(file, id, v)
		t.noteSynced(id, v, st)
	}
	return nil
}

// syncChunkAndEntries makes a chunk durable: its file, and the directory
// entries made for it. On a disk the two go at once (new small files at
// close: 7-20% more per second than one after the other); on a file
// system in memory, where a sync costs nothing, one after the other,
// which spares waking another thread.
func (t *Target) syncChunkAndEntries(f *chunkFile, id ID) error {
	if !t.inMemory {
		var entriesErr error
		var wg sync.WaitGroup
		wg.Go(func() { entriesErr = t.syncEntries(id.Ino) })
		err := t.syncLocked(f)
		wg.Wait()
		if err != nil {
			return err
		}
		return entriesErr
	}
	if err := t.syncLocked(f); err != nil {
		return err
	}
	return t.syncEntries(id.Ino)
}

// syncEntries fsyncs the directory of ino if chunk files were created in it
// since its last sync, and its parent if the directory itself is new.
func (t *Target) syncEntries(ino uint64) error {
	t.syncMu.Lock()
	newDir, ok := t.newEntries[ino]
	delete(t.newEntries, ino)
	t.syncMu.Unlock()
	if !ok {
		return nil
	}
	err := t.fs.SyncDir(t.inoDir(ino))
	if errors.Is(err, fs.ErrNotExist) { // deleted meanwhile
		return nil
	}
	if err == nil && newDir {
		err = t.fs.SyncDir(t.hashDir(ino))
	}
	if err != nil {
		t.markNewEntry(ino, newDir)
		return t.ioError(fmt.Sprintf("sync directory of inode %d", ino), err)
	}
	return nil
}

func (t *Target) markNewEntry(ino uint64, newDir bool) {
	t.syncMu.Lock()
	t.newEntries[ino] = t.newEntries[ino] || newDir
	t.syncMu.Unlock()
}
