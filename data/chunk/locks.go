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
