package pebblekv

import (
	"sort"
	"strings"
)

// The committer's read cache. Every write to the database goes through
// the committer goroutine (group.go), so the committer can keep what it
// read in memory and stay exact: a value in the cache is the committed
// value of its key, and a key noted absent is committed absent. Point
// reads of read-write transactions then skip pebble's lookup (a seek
// through every memtable and a bloom-filter probe per table level) for
// the keys every namespace operation reads again and again: directory
// inodes, counters, the layout generation, sessions.
//
// Only keys a read looked up enter the cache; a committed write updates
// what the cache knows of such a key (a deleted value becomes an absence,
// a set absence a value) and leaves other keys out, so the keys a create
// makes and nobody reads soon (a new name, a new inode) cost no room. A
// key set and deleted over and over (a file's open record, opened and
// released) must stay known absent: pebble finds a key whose newest
// version is a deletion by stepping over every older version still in
// the memtables, and an open of a file released thousands of times spent
// most of its time there. Absences are
// kept in a small set emptied when full: the names looked up once before
// being created churn it, the few absent keys read all the time (an unset
// layout generation, a directory without a default layout) come back at
// once.
//
// Only the committer touches the cache, so it needs no lock. Views read
// snapshots and never use it. Writes reach it only once their group's
// sync succeeded; a failed commit empties it.

// cacheMaxBytes bounds the values: past it, entries are dropped (in the
// map's random order) until a quarter of the room is free again.
const cacheMaxBytes = 32 << 20

// cacheMaxAbsent bounds the absent keys noted.
const cacheMaxAbsent = 4096

// cacheEntryOverhead is what an entry costs besides its key and value
// (map slot, string and slice headers), for the bound.
const cacheEntryOverhead = 64

// valueCache maps keys to their committed values, and notes keys
// committed absent.
type valueCache struct {
	m      map[string][]byte
	absent map[string]struct{}
	bytes  int
	max    int
}

func newValueCache(maxBytes int) *valueCache {
	return &valueCache{m: make(map[string][]byte), absent: make(map[string]struct{}), max: maxBytes}
}

// get returns the committed state of key if the cache knows it: its value
// (present) or its absence.
func (c *valueCache) get(key []byte) (v []byte, present, known bool) {
	if v, ok := c.m[string(key)]; ok {
		return v, true, true
	}
	if _, ok := c.absent[string(key)]; ok {
		return nil, false, true
	}
	return nil, false, false
}

// put records the committed value of key, read from the database; v is
// owned by the cache.
func (c *valueCache) put(key string, v []byte) {
	if old, ok := c.m[key]; ok {
		c.bytes -= len(key) + len(old) + cacheEntryOverhead
	}
	c.m[key] = v
	c.bytes += len(key) + len(v) + cacheEntryOverhead
	if c.bytes > c.max {
		c.shrink(c.max * 3 / 4)
	}
}

// putAbsent records that key is committed absent.
func (c *valueCache) putAbsent(key string) {
	if len(c.absent) >= cacheMaxAbsent {
		clear(c.absent)
	}
	c.absent[key] = struct{}{}
}

// update applies a committed write to what the cache knows of key: a
// key it knows stays known (a deleted value becomes an absence, a set
// absence a value), others stay out.
func (c *valueCache) update(key string, v []byte, deleted bool) {
	if _, ok := c.absent[key]; ok {
		if !deleted {
			delete(c.absent, key)
			c.put(key, v)
		}
		return
	}
	old, ok := c.m[key]
	if !ok {
		return
	}
	if deleted {
		delete(c.m, key)
		c.bytes -= len(key) + len(old) + cacheEntryOverhead
		c.putAbsent(key)
		return
	}
	c.m[key] = v
	c.bytes += len(v) - len(old)
}

// shrink drops values until the cache holds at most target bytes.
func (c *valueCache) shrink(target int) {
	for k, v := range c.m {
		if c.bytes <= target {
			return
		}
		delete(c.m, k)
		c.bytes -= len(k) + len(v) + cacheEntryOverhead
	}
}

// reset forgets everything (after a commit whose outcome is unknown).
func (c *valueCache) reset() {
	clear(c.m)
	clear(c.absent)
	c.bytes = 0
}

// write is a key's state as a transaction or group left it, not yet
// committed.
type write struct {
	v       []byte
	deleted bool
}

// groupWrites are the writes of a commit group so far: those of its
// transactions that succeeded (group) and those of the transaction
// running now (own), which join the group's when it succeeds. Only the
// final state of each key is kept: that is what the group commits.
type groupWrites struct {
	group map[string]write
	own   map[string]write
	bytes int // about what the group's batch will hold
}

func newGroupWrites() *groupWrites {
	return &groupWrites{group: make(map[string]write), own: make(map[string]write)}
}

func (g *groupWrites) set(key, value []byte) {
	g.own[string(key)] = write{v: append([]byte(nil), value...)}
}

func (g *groupWrites) del(key []byte) {
	g.own[string(key)] = write{deleted: true}
}

// lookup returns the latest uncommitted state of key in the group.
func (g *groupWrites) lookup(key []byte) (write, bool) {
	if w, ok := g.own[string(key)]; ok {
		return w, true
	}
	w, ok := g.group[string(key)]
	return w, ok
}

// keep merges the running transaction's writes into the group's and
// reports whether it wrote anything.
func (g *groupWrites) keep() bool {
	if len(g.own) == 0 {
		return false
	}
	for k, w := range g.own {
		g.group[k] = w
		g.bytes += len(k) + len(w.v)
	}
	clear(g.own)
	return true
}

// drop forgets the running transaction's writes (it failed).
func (g *groupWrites) drop() { clear(g.own) }

// pendingWrite is a key's uncommitted state, for scans.
type pendingWrite struct {
	key string
	write
}

// inRange returns the group's latest states of the keys in [start, end)
// (an empty end: no bound), sorted by key.
func (g *groupWrites) inRange(start, end []byte) []pendingWrite {
	var out []pendingWrite
	in := func(k string) bool {
		return k >= string(start) && (len(end) == 0 || k < string(end))
	}
	for k, w := range g.own {
		if in(k) {
			out = append(out, pendingWrite{key: k, write: w})
		}
	}
	for k, w := range g.group {
		if _, mine := g.own[k]; !mine && in(k) {
			out = append(out, pendingWrite{key: k, write: w})
		}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Compare(out[i].key, out[j].key) < 0 })
	return out
}
