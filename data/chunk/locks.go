package chunk

import "sync"

// lockTable hands out one RWMutex per key, kept only while in use. Locks
// are per exact key, not striped: a server forwards a mutation to the next
// member of a chain while holding its locks, and members of different
// chains forward in different directions, so two unrelated keys sharing a
// lock could deadlock across servers.
type lockTable[K comparable] struct {
	mu sync.Mutex
	m  map[K]*refLock
}

type refLock struct {
	sync.RWMutex
	refs int
}

func (lt *lockTable[K]) acquire(k K) *refLock {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.m == nil {
		lt.m = make(map[K]*refLock)
	}
	l := lt.m[k]
	if l == nil {
		l = &refLock{}
		lt.m[k] = l
	}
	l.refs++
	return l
}

func (lt *lockTable[K]) release(k K, l *refLock) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		delete(lt.m, k)
	}
}

// lock takes k exclusively (shared if !exclusive) and returns the unlock.
func (lt *lockTable[K]) lock(k K, exclusive bool) func() {
	l := lt.acquire(k)
	if exclusive {
		l.Lock()
		return func() { l.Unlock(); lt.release(k, l) }
	}
	l.RLock()
	return func() { l.RUnlock(); lt.release(k, l) }
}

// fileKey names the chunks of one file that belong to one chain: the unit
// a truncate or delete forwarded along that chain locks.
type fileKey struct {
	ino, chain uint64
}

// Locked is a chunk held exclusively for mutation (and the chunks of its
// file in its chain shared, so no truncate or delete of that chain runs
// meanwhile). A replicating caller applies a mutation and forwards it to
// the next replica before unlocking, so every replica sees the chunk's
// mutations in the same order. Its methods must not be called after
// Unlock, nor concurrently.
type Locked struct {
	t      *Target
	id     ID
	chain  uint64
	unlock []func()
}

// Lock takes chunk id of chain for mutation.
func (t *Target) Lock(id ID, chain uint64) *Locked {
	l := &Locked{t: t, id: id, chain: chain}
	l.unlock = append(l.unlock, t.fileLocks.lock(fileKey{id.Ino, chain}, false), t.chunkLocks.lock(id, true))
	return l
}

// Unlock releases the chunk.
func (l *Locked) Unlock() {
	for i := len(l.unlock) - 1; i >= 0; i-- {
		l.unlock[i]()
	}
	l.unlock = nil
}

// Info returns the chunk's version, chain and length. A chunk whose header
// is damaged fails with a *CorruptionError.
func (l *Locked) Info() (Info, error) {
	return l.t.info(l.id)
}

// info reads a chunk's header; the caller holds the chunk's lock.
func (t *Target) info(id ID) (Info, error) {
	f, err := t.openChunk(id, false)
	if err != nil || f == nil {
		return Info{ID: id}, err
	}
	defer t.store.files.release(f)
	if f.bad != nil && f.bad.Header {
		return Info{ID: id}, t.corrupt(f.bad)
	}
	return Info{ID: id, Exists: true, Version: f.hdr.version, Chain: f.hdr.chain, Length: f.size()}, nil
}
