package client

import (
	"slices"
	"sync"
)

// maxUnsyncedFiles bounds the closed files whose chains closedFiles
// remembers.
const maxUnsyncedFiles = 1 << 16

// closedFiles remembers, for files closed without waiting for the disks
// (without Config.CloseSync), the chains holding their chunks written
// without sync, so that an fsync through a later open of such a file
// syncs them (as Linux's fsync flushes pages written through descriptors
// closed before). Past maxUnsyncedFiles the oldest are forgotten, and
// from then on the first durable flush of a file opened without a record
// syncs every chain of its layout (a data server with nothing of the file
// to sync answers at once).
type closedFiles struct {
	mu     sync.Mutex
	chains map[uint64][]uint64 // ino -> chains with chunks not synced
	order  []uint64            // inos in the order they were put (may name some taken since)
	forgot bool                // some were forgotten
}

// put records the chains of unsynced (chunk index -> chain) of ino.
func (u *closedFiles) put(ino uint64, unsynced map[uint64]uint64) {
	if len(unsynced) == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.chains == nil {
		u.chains = make(map[uint64][]uint64)
	}
	chains, had := u.chains[ino]
	for _, ch := range unsynced {
		if !slices.Contains(chains, ch) {
			chains = append(chains, ch)
		}
	}
	u.chains[ino] = chains
	if !had {
		u.order = append(u.order, ino)
	}
	for len(u.chains) > maxUnsyncedFiles {
		delete(u.chains, u.order[0])
		u.order = u.order[1:]
		u.forgot = true
	}
	if len(u.order) > 2*maxUnsyncedFiles { // entries taken since
		u.order = slices.DeleteFunc(u.order, func(i uint64) bool { _, ok := u.chains[i]; return !ok })
	}
}

// take returns the unsynced chunks (index -> chain) to start an inode of
// ino with, and whether its record may have been forgotten (its first
// durable flush then syncs every chain of its layout). The indexes of
// remembered chains are not chunk indexes (none is that large): only the
// chains matter to a sync.
func (u *closedFiles) take(ino uint64) (unsynced map[uint64]uint64, unknown bool) {
	unsynced = make(map[uint64]uint64)
	u.mu.Lock()
	defer u.mu.Unlock()
	chains, ok := u.chains[ino]
	if !ok {
		return unsynced, u.forgot
	}
	delete(u.chains, ino)
	for i, ch := range chains {
		unsynced[^uint64(i)] = ch
	}
	return unsynced, false
}
