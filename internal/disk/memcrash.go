package disk

import (
	"maps"
	"math/rand/v2"
	"slices"
)

// Crashes: a power loss now (Crash, CrashCopy) or after a given number
// of changes (CrashAfter), and the image of what it leaves.

// CrashAfter arms a crash: ops more changes (writes, truncates, hole
// punches, syncs, creates, renames, removes) are made, and instead of
// the next one the Mem crashes as Crash does, with rng choosing what
// survives; Image then returns the result.
func (m *Mem) CrashAfter(ops int, rng *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.countdown, m.crashRNG = ops, rng
}

// Image returns what an armed crash left, or nil if it has not happened.
func (m *Mem) Image() *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.image
}

// change is called, with m.mu held, before each change: it fails if the
// Mem crashed, or crashes it now if an armed crash is due.
func (m *Mem) change() error {
	if m.crashed {
		return ErrCrashed
	}
	switch {
	case m.countdown == 0:
		m.image = m.crashLocked(m.crashRNG)
		return ErrCrashed
	case m.countdown > 0:
		m.countdown--
	}
	return nil
}

// Crash simulates a power loss now: it returns what the file system could
// hold after it (see Mem), chosen with rng (nil: nothing that was not
// synced survives), and makes every later operation on m fail with
// ErrCrashed.
func (m *Mem) Crash(rng *rand.Rand) *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.crashLocked(rng)
}

// CrashCopy returns what a crash now could leave (as Crash does) while m
// goes on working: for a crash under writers that must not see it.
func (m *Mem) CrashCopy(rng *rand.Rand) *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.imageLocked(rng)
}

func (m *Mem) crashLocked(rng *rand.Rand) *Mem {
	m.crashed = true
	return m.imageLocked(rng)
}

func (m *Mem) imageLocked(rng *rand.Rand) *Mem {
	view := make(map[*memNode]map[string]*memNode, len(m.durable))
	for d, entries := range m.durable {
		view[d] = mapsClone(entries)
	}
	kept := 0
	if rng != nil {
		kept = rng.IntN(len(m.log) + 1)
	}
	for _, op := range m.log[:kept] {
		applyOp(view, op)
	}
	out := &Mem{locks: map[string]bool{}, capacity: m.capacity, durable: map[*memNode]map[string]*memNode{}, countdown: -1}
	copied := map[*memNode]*memNode{}
	var clone func(n *memNode) *memNode
	clone = func(n *memNode) *memNode {
		if c := copied[n]; c != nil {
			return c
		}
		if n.dir {
			c := newDir(n.mode.Perm())
			copied[n] = c
			for _, name := range slices.Sorted(maps.Keys(view[n])) {
				c.children[name] = clone(view[n][name])
			}
			out.durable[c] = mapsClone(c.children)
			return c
		}
		c := n.crashCopy(rng)
		copied[n] = c
		out.used += int64(len(c.pages)) * PageSize
		return c
	}
	out.root = clone(m.root)
	return out
}

func mapsClone[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// crashCopy is the file as a crash could leave it: its synced pages and
// size, and any of the changes since.
func (n *memNode) crashCopy(rng *rand.Rand) *memNode {
	c := newFile(n.mode.Perm())
	c.modTime = n.modTime
	c.size = n.syncedSize
	if rng != nil && n.size != n.syncedSize && rng.IntN(2) == 0 {
		c.size = n.size
	}
	for i, p := range n.synced {
		c.pages[i] = p
	}
	for _, i := range slices.Sorted(maps.Keys(n.dirty)) { // in order: a seed replays
		if rng == nil || rng.IntN(2) == 0 {
			continue
		}
		if p := n.pages[i]; p != nil {
			c.pages[i] = p
		} else {
			delete(c.pages, i)
		}
	}
	// Pages past the size are gone; the rest of a partial last page
	// reads as zeros.
	for i, p := range c.pages {
		switch start := i * PageSize; {
		case start >= c.size:
			delete(c.pages, i)
		case start+PageSize > c.size:
			q := *p
			clear(q[c.size-start:])
			c.pages[i] = &q
		}
	}
	for i, p := range c.pages {
		c.synced[i] = p
	}
	c.syncedSize = c.size
	return c
}
