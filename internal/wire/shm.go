package wire

import (
	"fmt"
	"math/bits"
	"net"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared memory on the Unix socket.
//
// A client on the same host as its data server gives the server, once per
// Unix socket connection (opAttach, the descriptor sent with
// SCM_RIGHTS), a memfd that both then map: the client's arena. Chunk
// writes name the bytes to write by their place in the arena
// (opWriteShm), and chunk reads the place to read into (opReadShm), so
// bulk data crosses between the processes without passing through the
// socket: the server writes the file straight from the client's buffer
// and reads it straight into one.
//
// The memfd is sealed against shrinking (F_SEAL_SHRINK), so the server
// can never touch a page that is gone (which would be SIGBUS), and is
// mapped read-write only when the client opened it so.

// Arena sizes: buffers of 64 KiB to 64 MiB, in power-of-two classes,
// carved out of one mapping.
const (
	arenaMinShift = 16
	arenaMaxShift = 26
	// ArenaSize is the virtual size of a process's arena; pages take
	// memory only once used.
	ArenaSize = 1 << 30
	// maxIdleArena bounds the memory free buffers keep for reuse; the
	// pages of more are given back to the system.
	maxIdleArena = 64 << 20
)

// arena is the process's shared buffer space.
type arena struct {
	fd   int
	mem  []byte
	base uintptr

	mu   sync.Mutex
	next int                                          // bump offset
	free [arenaMaxShift - arenaMinShift + 1][]idleBuf // free buffers per class, pages kept, oldest first
	cold [arenaMaxShift - arenaMinShift + 1][]int     // free offsets per class, pages dropped
	hot  int                                          // bytes of pages kept by the free buffers
	seq  uint64                                       // buffers freed so far
	live map[int]*slot                                // buffers handed out, by offset
}

// idleBuf is a free buffer whose pages are kept: the first used bytes
// of it may hold pages.
type idleBuf struct {
	off, used int
	seq       uint64 // arena.seq when it was freed
}

// slot is a buffer handed out by get.
type slot struct {
	class int
	used  int  // bytes that may have been touched (rounded up to pages when freed)
	lent  int  // requests a server may still be serving from or into it
	freed bool // given back while lent: free once no longer lent
}

var (
	theArena     *arena
	theArenaErr  error
	theArenaOnce sync.Once
)

// sharedArena returns the process's arena, made on first use; nil (with
// the reason) if the platform gives none.
func sharedArena() (*arena, error) {
	theArenaOnce.Do(func() {
		theArena, theArenaErr = newArena(ArenaSize)
	})
	return theArena, theArenaErr
}

func newArena(size int) (*arena, error) {
	fd, err := unix.MemfdCreate("weft-wire-arena", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(what string, err error) (*arena, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s of the shared arena: %w", what, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("size", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("map", err)
	}
	return &arena{fd: fd, mem: mem, base: uintptr(unsafe.Pointer(&mem[0])), live: make(map[int]*slot)}, nil
}

// arenaClass is the class of an n-byte buffer, or -1 if no class holds it.
func arenaClass(n int) int {
	if n <= 0 || n > 1<<arenaMaxShift {
		return -1
	}
	if n <= 1<<arenaMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - arenaMinShift
}

// get returns n bytes of the arena (not zeroed), or nil when it has no
// room for them.
func (a *arena) get(n int) []byte { return a.getTouching(n, n) }

// getTouching is get for a caller that will touch only the first touch
// bytes (to start with: put and lend see how far the buffer grew).
func (a *arena) getTouching(n, touch int) []byte {
	c := arenaClass(n)
	if c < 0 {
		return nil
	}
	size := 1 << (c + arenaMinShift)
	a.mu.Lock()
	defer a.mu.Unlock()
	var off int
	used := touch
	if l := len(a.free[c]); l > 0 {
		ib := a.free[c][l-1]
		a.free[c] = a.free[c][:l-1]
		a.hot -= ib.used
		off, used = ib.off, max(touch, ib.used)
	} else if l := len(a.cold[c]); l > 0 {
		off = a.cold[c][l-1]
		a.cold[c] = a.cold[c][:l-1]
	} else {
		off = (a.next + size - 1) &^ (size - 1)
		if off+size > len(a.mem) {
			return nil
		}
		a.next = off + size
	}
	a.live[off] = &slot{class: c, used: used}
	return a.mem[off : off+n : off+size]
}

// put gives back a buffer of get (b starts where it starts). A buffer
// still lent to a server is freed only once the server is done with it.
func (a *arena) put(b []byte) {
	off, ok := a.offset(b)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.live[int(off)]
	if s != nil {
		s.used = max(s.used, len(b))
	}
	switch {
	case s == nil || s.freed:
		return
	case s.lent > 0:
		s.freed = true
		return
	}
	a.freeLocked(int(off), s)
}

// freeLocked puts a buffer on a free list. Idle pages are counted by the
// bytes its users may have touched, not its class size: a small write's
// buffer in a large class keeps few pages, and reusing it costs no page
// faults (about 2 us per page on a VM), where dropping and touching its
// pages again would.
//
// Past maxIdleArena the pages of the buffers idle longest go back to the
// system, whatever their class, and the buffer freed now keeps its own:
// what is freed now is what the current work uses. Dropping the newest
// instead left idle memory full of buffers of a workload that was over
// (8 KiB random writes leave 64 KiB ones) while every buffer of the next
// had its pages dropped and faulted in again: four 256 KiB writers on a
// tmpfs after the 8 KiB workloads spent 9% of weft's CPU on page faults
// and MADV_REMOVE.
func (a *arena) freeLocked(off int, s *slot) {
	delete(a.live, off)
	size := 1 << (s.class + arenaMinShift)
	used := min(size, (s.used+pageSize-1)&^(pageSize-1))
	for a.hot+used > maxIdleArena && a.dropOldestLocked() {
	}
	if a.hot+used <= maxIdleArena || !a.dropPages(off, used) {
		a.seq++
		a.free[s.class] = append(a.free[s.class], idleBuf{off: off, used: used, seq: a.seq})
		a.hot += used
		return
	}
	a.cold[s.class] = append(a.cold[s.class], off)
}

// dropOldestLocked gives the pages of the buffer idle longest back to the
// system; false if there is none (or they could not be dropped).
func (a *arena) dropOldestLocked() bool {
	oldest := -1
	for c, l := range a.free {
		if len(l) > 0 && (oldest < 0 || l[0].seq < a.free[oldest][0].seq) {
			oldest = c
		}
	}
	if oldest < 0 {
		return false
	}
	ib := a.free[oldest][0]
	if !a.dropPages(ib.off, ib.used) {
		return false
	}
	a.free[oldest] = a.free[oldest][1:]
	a.hot -= ib.used
	a.cold[oldest] = append(a.cold[oldest], ib.off)
	return true
}

// dropPages gives the first used bytes' pages of the buffer at off back to
// the system (the server's mapping sees zeros there, which nobody reads).
func (a *arena) dropPages(off, used int) bool {
	return used == 0 || unix.Madvise(a.mem[off:off+used], unix.MADV_REMOVE) == nil
}

// pageSize is the granularity of the pages freeLocked counts and drops.
const pageSize = 4 << 10

// lend marks buffer b (which starts where a buffer of get starts) as
// being served by a server: put does not free it until unlend. It reports
// false if b is no such buffer.
func (a *arena) lend(b []byte) bool {
	off, ok := a.offset(b)
	if !ok {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.live[int(off)]
	if s == nil || s.freed {
		return false
	}
	s.lent++
	s.used = max(s.used, len(b))
	return true
}

// unlend ends a lend of b: the server has answered.
func (a *arena) unlend(b []byte) {
	off, _ := a.offset(b)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.live[int(off)]
	if s == nil {
		return
	}
	s.lent--
	if s.lent == 0 && s.freed {
		a.freeLocked(int(off), s)
	}
}

// offset is where b starts in the arena, if it lies wholly in it.
func (a *arena) offset(b []byte) (uint64, bool) {
	if a == nil || cap(b) == 0 {
		return 0, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < a.base || p+uintptr(len(b)) > a.base+uintptr(len(a.mem)) {
		return 0, false
	}
	return uint64(p - a.base), true
}

// GetShared returns a buffer of n bytes (not zeroed) from the process's
// shared arena when it has room, else from the pool (GetBuffer). Data
// written from it, or read into it, over a Unix socket connection to a
// data server does not pass through the socket. Give it back with
// PutShared.
func GetShared(n int) []byte {
	if a, _ := sharedArena(); a != nil {
		if b := a.get(n); b != nil {
			return b
		}
	}
	return GetBuffer(n)
}

// ReserveShared returns a buffer of n bytes of the process's shared
// arena, or nil when the arena has no room (or there is none). Its pages
// take memory only once written. Give it back with PutShared.
func ReserveShared(n int) []byte {
	if a, _ := sharedArena(); a != nil {
		return a.getTouching(n, 0)
	}
	return nil
}

// ReleaseShared gives back b if it is a buffer of the shared arena
// (ReserveShared), and does nothing for any other: unlike PutShared it
// never pools memory that came from elsewhere.
func ReleaseShared(b []byte) {
	if a := theArenaIfMade(); a != nil {
		a.put(b)
	}
}

// PutShared gives back a buffer of GetShared.
func PutShared(b []byte) {
	if a := theArenaIfMade(); a != nil {
		if _, ok := a.offset(b); ok {
			a.put(b)
			return
		}
	}
	PutBuffer(b)
}

// theArenaIfMade is the process's arena if one was made.
func theArenaIfMade() *arena {
	if a, _ := sharedArena(); a != nil {
		return a
	}
	return nil
}

// peerArena is a client's arena as its server maps it.
type peerArena struct {
	mem []byte
}

// maxPeerArena bounds the arena a client may give a server.
const maxPeerArena = 16 << 30

// mapPeerArena maps the memfd fd a client sent; fd is closed.
func mapPeerArena(fd int) (*peerArena, error) {
	defer unix.Close(fd)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("not a sealed memfd: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("the memfd may shrink (seal it with F_SEAL_SHRINK)")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	if st.Size <= 0 || st.Size > maxPeerArena {
		return nil, fmt.Errorf("arena of %d bytes (at most %d)", st.Size, int64(maxPeerArena))
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map: %w", err)
	}
	return &peerArena{mem: mem}, nil
}

// slice returns [off, off+n) of the arena, or false if out of it.
func (p *peerArena) slice(off, n uint64) ([]byte, bool) {
	if p == nil || n > uint64(len(p.mem)) || off > uint64(len(p.mem))-n {
		return nil, false
	}
	return p.mem[off : off+n : off+n], true
}

// unmap releases the mapping; nothing may use it afterwards.
func (p *peerArena) unmap() {
	if p != nil && p.mem != nil {
		unix.Munmap(p.mem)
		p.mem = nil
	}
}

// shmOffEnv turns the shared arena off for the processes that have it
// set (to measure the socket path, or where memfds misbehave).
const shmOffEnv = "WEFT_WIRE_SHM"

// shmWanted reports whether this process offers its arena to servers.
func shmWanted() bool { return os.Getenv(shmOffEnv) != "off" }

// fdReader reads a Unix socket connection and keeps the descriptors that
// come with its bytes (SCM_RIGHTS), for opAttach.
type fdReader struct {
	uc  *net.UnixConn
	oob [64]byte

	mu  sync.Mutex
	fds []int
}

// Read implements io.Reader.
func (r *fdReader) Read(p []byte) (int, error) {
	n, oobn, _, _, err := r.uc.ReadMsgUnix(p, r.oob[:])
	if oobn > 0 {
		r.keep(r.oob[:oobn])
	}
	return max(n, 0), err
}

// keep parses control messages and keeps their descriptors.
func (r *fdReader) keep(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		r.mu.Lock()
		r.fds = append(r.fds, fds...)
		r.mu.Unlock()
	}
}

// take returns the oldest descriptor received, or -1.
func (r *fdReader) take() int {
	if r == nil {
		return -1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.fds) == 0 {
		return -1
	}
	fd := r.fds[0]
	r.fds = r.fds[1:]
	return fd
}

// closeAll closes the descriptors nobody took.
func (r *fdReader) closeAll() {
	if r == nil {
		return
	}
	for fd := r.take(); fd >= 0; fd = r.take() {
		unix.Close(fd)
	}
}

// ArenaInUse is the number of bytes of the process's shared arena handed
// out and not given back (buffers of classes, so rounded up).
func ArenaInUse() int64 {
	a := theArenaIfMade()
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, s := range a.live {
		n += 1 << (s.class + arenaMinShift)
	}
	return n
}
