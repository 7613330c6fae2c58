package meta

import (
	"sync"
	"sync/atomic"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Limits of the callback state. Both are per session, so memory is
// bounded by the number of sessions.
const (
	// defaultMaxInterest is how many inodes (files, or directories whose
	// names are cached) the service remembers per session; past it the
	// session is told to drop everything (Invalidation.all) and starts
	// over.
	defaultMaxInterest = 1 << 18
	// defaultMaxPending is how many invalidations wait for a slow
	// session's stream before they collapse into one Invalidation.all.
	defaultMaxPending = 4096
	// recentChanges is how many changed inodes are remembered to close
	// the race between reading an inode and registering interest in it.
	recentChanges = 4096
	// idleSessionAge is how long the interest of a session without a
	// callback stream is kept; it is useless without one (a stream that
	// attaches starts with Invalidation.all).
	idleSessionAge = 2 * time.Minute
)

// cbEntry names a directory entry.
type cbEntry struct {
	parent uint64
	name   string
}

// cbSession is the callback state of one client session: what it caches
// and what it has not been told yet.
type cbSession struct {
	id       string
	interest map[uint64]struct{}
	// stream is the generation of the attached Watch stream, 0 if none.
	stream  uint64
	idleAt  time.Time // when the last stream detached (or the session was first seen)
	inodes  map[uint64]struct{}
	entries map[cbEntry]struct{}
	all     bool
	// recalls are create delegations to ask back (delegate.go), kept
	// across Invalidation.all and until a stream takes them.
	recalls map[uint64]uint64 // directory -> generation
	wake    chan struct{}
}

func (cs *cbSession) signal() {
	select {
	case cs.wake <- struct{}{}:
	default:
	}
}

// change is one inode changed, for the recent-changes ring.
type change struct {
	seq    uint64
	ino    uint64
	origin string
}

// callbacks is the meta service's callback hub (AFS/Coda style): it
// remembers which sessions cached which inodes and queues invalidations
// for them when a committed transaction changes those inodes or the
// entries of those directories.
type callbacks struct {
	maxInterest, maxPending int
	// serverID marks this process's transactions in a shared store.
	serverID string

	mu       sync.Mutex
	sessions map[string]*cbSession
	// byIno maps an inode to the sessions interested in it.
	byIno map[uint64][]*cbSession
	seq   uint64 // changes published so far
	ring  [recentChanges]change
	gen   uint64 // stream generations
	done  chan struct{}
	once  sync.Once

	// Counters for status and benchmarks.
	published atomic.Uint64 // inode and entry changes published
	sent      atomic.Uint64 // Invalidation messages sent
	alls      atomic.Uint64 // Invalidation.all sent
}

func newCallbacks() *callbacks {
	return &callbacks{
		maxInterest: defaultMaxInterest, maxPending: defaultMaxPending, serverID: newServerID(),
		sessions: make(map[string]*cbSession),
		byIno:    make(map[uint64][]*cbSession),
		done:     make(chan struct{}),
		seq:      1, // a mark is never 0: register takes 0 as "no mark"
	}
}

// close ends every Watch stream.
func (h *callbacks) close() { h.once.Do(func() { close(h.done) }) }

func (h *callbacks) sessionLocked(id string) *cbSession {
	cs := h.sessions[id]
	if cs == nil {
		cs = &cbSession{
			id: id, interest: make(map[uint64]struct{}), idleAt: time.Now(),
			inodes: make(map[uint64]struct{}), entries: make(map[cbEntry]struct{}),
			recalls: make(map[uint64]uint64), wake: make(chan struct{}, 1),
		}
		h.sessions[id] = cs
	}
	return cs
}

// mark returns the change sequence number, to be passed to register for
// inodes read after it.
func (h *callbacks) mark() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// register records that session caches inodes. since is a mark taken
// before the inodes were read: an inode changed by someone else in
// between is queued for invalidation at once (its reply may be stale).
// since 0 means the inodes were registered before being read.
func (h *callbacks) register(session string, since uint64, inos ...uint64) {
	if session == "" || len(inos) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.sessionLocked(session)
	for _, ino := range inos {
		if _, ok := cs.interest[ino]; ok || ino == 0 {
			continue
		}
		if len(cs.interest) >= h.maxInterest {
			h.resetLocked(cs)
		}
		cs.interest[ino] = struct{}{}
		h.byIno[ino] = append(h.byIno[ino], cs)
	}
	if since == 0 || since == h.seq {
		return
	}
	if h.seq-since > recentChanges {
		h.queueAllLocked(cs)
		return
	}
	for seq := h.seq; seq > since; seq-- {
		c := h.ring[seq%recentChanges]
		if c.origin == session {
			continue
		}
		for _, ino := range inos {
			if c.ino == ino {
				h.queueLocked(cs, ino, nil)
			}
		}
	}
}

// resetLocked forgets everything session cs caches and tells it to drop
// its caches: its interest outgrew the limit.
func (h *callbacks) resetLocked(cs *cbSession) {
	for ino := range cs.interest {
		h.dropLocked(cs, ino)
	}
	cs.interest = make(map[uint64]struct{})
	h.queueAllLocked(cs)
}

// dropLocked removes cs from the sessions interested in ino (not from
// cs.interest).
func (h *callbacks) dropLocked(cs *cbSession, ino uint64) {
	list := h.byIno[ino]
	for i, s := range list {
		if s == cs {
			list[i] = list[len(list)-1]
			list = list[:len(list)-1]
			break
		}
	}
	if len(list) == 0 {
		delete(h.byIno, ino)
	} else {
		h.byIno[ino] = list
	}
}

// forget drops session's interest in inos (the client's kernel forgot
// them).
func (h *callbacks) forget(session string, inos []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.sessions[session]
	if cs == nil {
		return
	}
	for _, ino := range inos {
		if _, ok := cs.interest[ino]; ok {
			delete(cs.interest, ino)
			h.dropLocked(cs, ino)
		}
	}
}

// endSession forgets a session's callback state.
func (h *callbacks) endSession(session string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.sessions[session]
	if cs == nil {
		return
	}
	for ino := range cs.interest {
		h.dropLocked(cs, ino)
	}
	delete(h.sessions, session)
	cs.stream = 0
	cs.signal()
}

// queueLocked queues an invalidation of inode ino (e nil) or of entry e
// for cs, collapsing into all when too much is pending. Sessions without
// a stream get nothing: a stream that attaches starts with all.
func (h *callbacks) queueLocked(cs *cbSession, ino uint64, e *cbEntry) {
	if cs.stream == 0 || cs.all {
		return
	}
	if e != nil {
		cs.entries[*e] = struct{}{}
	} else {
		cs.inodes[ino] = struct{}{}
	}
	if len(cs.inodes)+len(cs.entries) > h.maxPending {
		h.queueAllLocked(cs)
		return
	}
	cs.signal()
}

func (h *callbacks) queueAllLocked(cs *cbSession) {
	if cs.stream == 0 {
		return
	}
	cs.all = true
	clear(cs.inodes)
	clear(cs.entries)
	cs.signal()
}

// invalidation is what one committed transaction changed.
type invalidation struct {
	inodes  []uint64
	entries []cbEntry
}

// publish queues inv for every session interested in what changed, except
// origin (the session whose request made the change: its kernel already
// knows, see README.md "Callbacks").
func (h *callbacks) publish(inv invalidation, origin string) {
	if len(inv.inodes) == 0 && len(inv.entries) == 0 {
		return
	}
	h.published.Add(uint64(len(inv.inodes) + len(inv.entries)))
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ino := range inv.inodes {
		h.seq++
		h.ring[h.seq%recentChanges] = change{seq: h.seq, ino: ino, origin: origin}
		for _, cs := range h.byIno[ino] {
			if cs.id != origin {
				h.queueLocked(cs, ino, nil)
			}
		}
	}
	for i := range inv.entries {
		e := &inv.entries[i]
		for _, cs := range h.byIno[e.parent] {
			if cs.id != origin {
				h.queueLocked(cs, 0, e)
			}
		}
	}
}

// recall asks session to return its create delegation gen of dir, on its
// callback stream (now, or when one attaches).
func (h *callbacks) recall(session string, dir, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.sessionLocked(session)
	cs.recalls[dir] = gen
	cs.signal()
}

// publishAll tells every session to drop everything (changes may have
// been missed).
func (h *callbacks) publishAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq += recentChanges + 1 // every registration in flight is suspect
	for _, cs := range h.sessions {
		h.queueAllLocked(cs)
	}
}

// attach makes a new Watch stream the session's stream (replacing an
// older one) and queues Invalidation.all as its first message: what the
// client cached before the stream may have changed unseen.
func (h *callbacks) attach(session string) (*cbSession, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.sessionLocked(session)
	h.gen++
	cs.stream = h.gen
	h.queueAllLocked(cs)
	return cs, h.gen
}

// detach ends stream gen of cs if it is still the current one.
func (h *callbacks) detach(cs *cbSession, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs.stream == gen {
		cs.stream = 0
		cs.idleAt = time.Now()
	}
}

// take returns what is pending for stream gen of cs, nil if nothing;
// ok is false once the stream was replaced or the session ended.
func (h *callbacks) take(cs *cbSession, gen uint64) (inv *weftv1.Invalidation, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs.stream != gen {
		return nil, false
	}
	var recalls []*weftv1.Recall
	for dir, gen := range cs.recalls {
		recalls = append(recalls, &weftv1.Recall{Dir: dir, Generation: gen})
	}
	clear(cs.recalls)
	switch {
	case cs.all:
		cs.all = false
		h.alls.Add(1)
		return &weftv1.Invalidation{All: true, Recalls: recalls}, true
	case len(cs.inodes) == 0 && len(cs.entries) == 0:
		if len(recalls) > 0 {
			return &weftv1.Invalidation{Recalls: recalls}, true
		}
		return nil, true
	}
	inv = &weftv1.Invalidation{Inodes: make([]uint64, 0, len(cs.inodes)), Recalls: recalls}
	for ino := range cs.inodes {
		inv.Inodes = append(inv.Inodes, ino)
	}
	for e := range cs.entries {
		inv.Entries = append(inv.Entries, &weftv1.EntryChange{Parent: e.parent, Name: e.name})
	}
	clear(cs.inodes)
	clear(cs.entries)
	return inv, true
}

// collectIdle forgets sessions that have had no stream for longer than
// idleSessionAge.
func (h *callbacks) collectIdle(now time.Time) {
	h.mu.Lock()
	var idle []string
	for id, cs := range h.sessions {
		if cs.stream == 0 && now.Sub(cs.idleAt) > idleSessionAge {
			idle = append(idle, id)
		}
	}
	h.mu.Unlock()
	for _, id := range idle {
		h.mu.Lock()
		cs := h.sessions[id]
		stillIdle := cs != nil && cs.stream == 0 && now.Sub(cs.idleAt) > idleSessionAge
		h.mu.Unlock()
		if stillIdle {
			h.endSession(id)
		}
	}
}

// stats returns the number of sessions and of (session, inode) interests.
func (h *callbacks) stats() (sessions, interests int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, cs := range h.sessions {
		interests += len(cs.interest)
	}
	return len(h.sessions), interests
}
