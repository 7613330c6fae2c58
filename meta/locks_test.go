package meta

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/etcdtest"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

const (
	rd = lockRead
	wr = lockWrite
	un = lockUnlock
)

// TestApplyLock checks the POSIX range arithmetic of one owner's locks:
// split, merge, conversion, partial unlock.
func TestApplyLock(t *testing.T) {
	me := lockOwner{"s", 1}
	l := func(start, end uint64, typ uint32) heldLock {
		return heldLock{lockOwner: me, start: start, end: end, typ: typ}
	}
	tests := []struct {
		name       string
		mine       []heldLock
		start, end uint64
		typ        uint32
		want       []heldLock
	}{
		{"first lock", nil, 0, 9, wr, []heldLock{l(0, 9, wr)}},
		{"merge overlapping", []heldLock{l(0, 9, rd)}, 5, 19, rd, []heldLock{l(0, 19, rd)}},
		{"merge adjacent", []heldLock{l(0, 9, rd), l(20, 29, rd)}, 10, 19, rd, []heldLock{l(0, 29, rd)}},
		{"adjacent other type stays", []heldLock{l(0, 9, rd)}, 10, 19, wr, []heldLock{l(0, 9, rd), l(10, 19, wr)}},
		{"convert middle splits", []heldLock{l(0, 99, rd)}, 40, 59, wr, []heldLock{l(0, 39, rd), l(40, 59, wr), l(60, 99, rd)}},
		{"convert all", []heldLock{l(0, 99, rd)}, 0, 99, wr, []heldLock{l(0, 99, wr)}},
		{"convert covering two", []heldLock{l(0, 9, rd), l(20, 29, wr), l(40, 49, rd)}, 5, 44, wr, []heldLock{l(0, 4, rd), l(5, 44, wr), l(45, 49, rd)}},
		{"unlock middle", []heldLock{l(0, 99, wr)}, 10, 19, un, []heldLock{l(0, 9, wr), l(20, 99, wr)}},
		{"unlock start", []heldLock{l(0, 99, wr)}, 0, 49, un, []heldLock{l(50, 99, wr)}},
		{"unlock all to EOF", []heldLock{l(0, 9, rd), l(100, lockEOF, wr)}, 0, lockEOF, un, []heldLock{}},
		{"unlock nothing held", nil, 0, lockEOF, un, []heldLock{}},
		{"to EOF merges", []heldLock{l(0, lockEOF, rd)}, 10, lockEOF, rd, []heldLock{l(0, lockEOF, rd)}},
		{"lock EOF byte", []heldLock{l(0, 9, wr)}, lockEOF, lockEOF, wr, []heldLock{l(0, 9, wr), l(lockEOF, lockEOF, wr)}},
		{"relock same", []heldLock{l(0, 9, wr)}, 0, 9, wr, []heldLock{l(0, 9, wr)}},
		{"lock inside same type", []heldLock{l(0, 99, wr)}, 10, 19, wr, []heldLock{l(0, 99, wr)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := applyLock(tt.mine, me, tt.start, tt.end, tt.typ, 0)
			if !sameLocks(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// lockEnv is a meta service with sessions and one file to lock.
type lockEnv struct {
	t   *testing.T
	s   *Service
	ctx context.Context
	ino uint64
}

func newLockEnv(t *testing.T, s *Service) *lockEnv {
	t.Helper()
	e := &lockEnv{t: t, s: s, ctx: context.Background()}
	r, err := s.Create(e.ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: fmt.Sprintf("lockfile-%d", time.Now().UnixNano()), Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	e.ino = r.Attr.Ino
	return e
}

func (e *lockEnv) session(host string) string {
	e.t.Helper()
	r, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: host})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Session
}

func (e *lockEnv) req(sess string, owner uint64, typ uint32, start, end uint64, flock bool) *weftv1.LockRequest {
	return &weftv1.LockRequest{Caller: &weftv1.Caller{Session: sess, Pid: uint32(owner * 100)}, Ino: e.ino, Owner: owner,
		Start: start, End: end, Type: typ, Pid: uint32(owner * 100), Flock: flock}
}

// TestLockSemantics runs sequences of lock operations by owners in two
// sessions and checks each result: shared read locks, exclusive write
// locks, conversion, partial unlock, F_GETLK with the holder's pid, flock
// independent of POSIX locks, flock conversion.
func TestLockSemantics(t *testing.T) {
	s := openService(t, nil, startChunkServer(t))
	type step struct {
		sess       int // 0 or 1
		owner      uint64
		get        bool // F_GETLK instead of F_SETLK
		flock      bool
		typ        uint32
		start, end uint64
		errno      syscall.Errno
		// For get: the conflicting lock expected (type un: none).
		wantType       uint32
		wantStart      uint64
		wantEnd        uint64
		wantPid, wantO uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"read locks are shared", []step{
			{sess: 0, owner: 1, typ: rd, start: 0, end: 99},
			{sess: 1, owner: 2, typ: rd, start: 50, end: 149},
			{sess: 1, owner: 2, typ: wr, start: 50, end: 60, errno: syscall.EAGAIN},
			{sess: 1, owner: 2, get: true, typ: wr, start: 0, end: lockEOF, wantType: rd, wantStart: 0, wantEnd: 99, wantPid: 100, wantO: 1},
		}},
		{"write lock is exclusive, same owner in another session is another owner", []step{
			{sess: 0, owner: 1, typ: wr, start: 10, end: 19},
			{sess: 1, owner: 1, typ: rd, start: 15, end: 15, errno: syscall.EAGAIN},
			{sess: 1, owner: 1, typ: wr, start: 20, end: 29},
			{sess: 0, owner: 1, get: true, typ: rd, start: 0, end: lockEOF, wantType: wr, wantStart: 20, wantEnd: 29, wantPid: 100, wantO: 1},
			{sess: 0, owner: 1, get: true, typ: wr, start: 10, end: 19, wantType: un},
		}},
		{"same owner converts and splits", []step{
			{sess: 0, owner: 1, typ: rd, start: 0, end: 99},
			{sess: 0, owner: 1, typ: wr, start: 40, end: 59},
			{sess: 1, owner: 2, typ: rd, start: 0, end: 39},
			{sess: 1, owner: 2, typ: rd, start: 60, end: 99},
			{sess: 1, owner: 2, typ: rd, start: 45, end: 45, errno: syscall.EAGAIN},
			{sess: 1, owner: 2, get: true, typ: rd, start: 0, end: lockEOF, wantType: wr, wantStart: 40, wantEnd: 59, wantPid: 100, wantO: 1},
		}},
		{"partial unlock frees the middle only", []step{
			{sess: 0, owner: 1, typ: wr, start: 0, end: lockEOF},
			{sess: 0, owner: 1, typ: un, start: 100, end: 199},
			{sess: 1, owner: 2, typ: wr, start: 100, end: 199},
			{sess: 1, owner: 2, typ: wr, start: 99, end: 100, errno: syscall.EAGAIN},
			{sess: 1, owner: 2, typ: rd, start: 200, end: 200, errno: syscall.EAGAIN},
			{sess: 0, owner: 1, typ: un, start: 0, end: lockEOF},
			{sess: 1, owner: 2, typ: wr, start: 0, end: lockEOF},
		}},
		{"downgrade lets readers in", []step{
			{sess: 0, owner: 1, typ: wr, start: 0, end: 9},
			{sess: 1, owner: 2, typ: rd, start: 0, end: 9, errno: syscall.EAGAIN},
			{sess: 0, owner: 1, typ: rd, start: 0, end: 9},
			{sess: 1, owner: 2, typ: rd, start: 0, end: 9},
			{sess: 0, owner: 1, typ: wr, start: 0, end: 9, errno: syscall.EAGAIN},
		}},
		{"flock is independent of POSIX locks", []step{
			{sess: 0, owner: 1, typ: wr, start: 0, end: lockEOF},
			{sess: 1, owner: 2, flock: true, typ: wr},
			{sess: 0, owner: 3, flock: true, typ: rd, errno: syscall.EAGAIN},
			{sess: 1, owner: 2, typ: rd, start: 0, end: 0, errno: syscall.EAGAIN},
			{sess: 1, owner: 2, flock: true, typ: un},
			{sess: 0, owner: 3, flock: true, typ: rd},
			{sess: 1, owner: 4, flock: true, typ: rd},
			{sess: 1, owner: 4, flock: true, typ: wr, errno: syscall.EAGAIN},
			// The failed upgrade dropped owner 4's shared lock (Linux), so
			// owner 3 can upgrade now.
			{sess: 0, owner: 3, flock: true, typ: wr},
		}},
		{"unlock without locks and bad requests", []step{
			{sess: 0, owner: 1, typ: un, start: 0, end: lockEOF},
			{sess: 0, owner: 1, typ: 7, start: 0, end: 1, errno: syscall.EINVAL},
			{sess: 0, owner: 1, typ: rd, start: 10, end: 9, errno: syscall.EINVAL},
			{sess: 0, owner: 1, get: true, typ: un, start: 0, end: 9, errno: syscall.EINVAL},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newLockEnv(t, s)
			sess := []string{e.session("a"), e.session("b")}
			for i, st := range tt.steps {
				start, end := st.start, st.end
				if st.flock {
					start, end = 0, lockEOF
				}
				req := e.req(sess[st.sess], st.owner, st.typ, start, end, st.flock)
				var err error
				var resp *weftv1.LockResponse
				if st.get {
					resp, err = s.GetLock(e.ctx, req)
				} else {
					_, err = s.SetLock(e.ctx, req)
				}
				if got := errnoOf(t, err); got != st.errno {
					t.Fatalf("step %d (%+v): errno %v (%v), want %v", i, st, got, err, st.errno)
				}
				if !st.get || err != nil {
					continue
				}
				if resp.Type != st.wantType || (st.wantType != un && (resp.Start != st.wantStart || resp.End != st.wantEnd ||
					resp.Pid != uint32(st.wantPid) || resp.Owner != st.wantO)) {
					t.Fatalf("step %d: F_GETLK got %+v, want type %d [%d, %d] pid %d owner %d", i, resp, st.wantType, st.wantStart, st.wantEnd, st.wantPid, st.wantO)
				}
			}
		})
	}
}

// TestLockNeedsLiveSession: a lock request without a session, or with an
// unknown one, fails; so does a lock on an inode that does not exist.
func TestLockNeedsLiveSession(t *testing.T) {
	s := openService(t, nil, startChunkServer(t))
	e := newLockEnv(t, s)
	_, err := s.SetLock(e.ctx, e.req("", 1, wr, 0, 9, false))
	wantErrno(t, err, syscall.EINVAL)
	_, err = s.SetLock(e.ctx, e.req("nosuchsession", 1, wr, 0, 9, false))
	wantErrno(t, err, syscall.ESTALE)
	req := e.req(e.session("a"), 1, wr, 0, 9, false)
	req.Ino = 1 << 40
	_, err = s.SetLock(e.ctx, req)
	wantErrno(t, err, syscall.ENOENT)
}

// TestLockWait: a waiting lock (F_SETLKW) is granted when the holder
// unlocks, and when the holder's session closes; a cancelled waiter ends
// with the context's error and leaves no lock behind.
func TestLockWait(t *testing.T) {
	s := openService(t, nil, startChunkServer(t))
	e := newLockEnv(t, s)
	a, b := e.session("a"), e.session("b")
	if _, err := s.SetLock(e.ctx, e.req(a, 1, wr, 0, lockEOF, false)); err != nil {
		t.Fatal(err)
	}
	waitFor := func(sess string, owner uint64) chan error {
		done := make(chan error, 1)
		go func() {
			req := e.req(sess, owner, wr, 0, 0, false)
			req.Wait = true
			_, err := s.SetLock(e.ctx, req)
			done <- err
		}()
		return done
	}
	notYet := func(done chan error) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("waiter returned while the lock is held: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	done := waitFor(b, 2)
	notYet(done)
	if _, err := s.SetLock(e.ctx, e.req(a, 1, un, 0, lockEOF, false)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter after unlock: %v", err)
	}

	// b holds byte 0 now; a waits for it and gets it when b's session
	// closes.
	done = waitFor(a, 1)
	notYet(done)
	if _, err := s.CloseSession(e.ctx, &weftv1.CloseSessionRequest{Session: b}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter after the holder's session closed: %v", err)
	}

	// A cancelled waiter.
	c := e.session("c")
	ctx, cancel := context.WithCancel(e.ctx)
	cdone := make(chan error, 1)
	go func() {
		req := e.req(c, 3, rd, 0, 0, false)
		req.Wait = true
		_, err := s.SetLock(ctx, req)
		cdone <- err
	}()
	notYet(cdone)
	cancel()
	if err := <-cdone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want context.Canceled", err)
	}
	if n := lockCount(t, s, c); n != 0 {
		t.Fatalf("cancelled waiter holds %d locks", n)
	}
}

// lockCount is the session's lock count as Status lists it.
func lockCount(t *testing.T, s *Service, sess string) uint32 {
	t.Helper()
	for _, st := range statusOf(t, s).SessionList {
		if st.Id == sess {
			return st.Locks
		}
	}
	t.Fatalf("session %s not listed in the status", sess)
	return 0
}

// TestLockSessionExpiryDropsLocks: the locks of a session whose lease runs
// out go with it, and Status lists sessions with their open files and
// locks.
func TestLockSessionExpiryDropsLocks(t *testing.T) {
	s := openService(t, nil, startChunkServer(t))
	e := newLockEnv(t, s)
	a, b := e.session("host-a"), e.session("host-b")
	if _, err := s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: e.ino, Session: a}); err != nil {
		t.Fatal(err)
	}
	for i := range uint64(3) {
		if _, err := s.SetLock(e.ctx, e.req(a, 1, wr, i*10, i*10+4, false)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SetLock(e.ctx, e.req(a, 9, rd, 0, 0, true)); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, st := range statusOf(t, s).SessionList {
		if st.Id == a {
			found = true
			if st.Host != "host-a" || st.OpenFiles != 1 || st.Locks != 4 || st.ExpiresInMs <= 0 {
				t.Fatalf("session status %+v, want host-a, 1 open file, 4 locks, lease left", st)
			}
		}
	}
	if !found {
		t.Fatal("session not listed")
	}
	// Expire a: move the service's clock past its lease.
	s.now = func() time.Time { return time.Now().Add(defaultSessionLease + time.Minute) }
	if _, err := s.RenewSession(e.ctx, &weftv1.RenewSessionRequest{Session: b}); err != nil {
		t.Fatal(err)
	}
	if err := s.expireSessions(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, s, prefixLock) + countKeys(t, s, prefixSessLock); n != 0 {
		t.Fatalf("%d lock keys left after the session expired", n)
	}
	if _, err := s.SetLock(e.ctx, e.req(b, 2, wr, 0, lockEOF, false)); err != nil {
		t.Fatalf("lock after the holder expired: %v", err)
	}
	if _, err := s.SetLock(e.ctx, e.req(b, 2, wr, 0, 0, true)); err != nil {
		t.Fatalf("flock after the holder expired: %v", err)
	}
}

// TestLockManyLocksSessionClose closes a session holding more lock
// records than one etcd transaction may touch, on pebble (the etcd test
// runs it over etcd), and checks the per-inode limit.
func TestLockManyLocksSessionClose(t *testing.T) {
	checkManyLocksClose(t, openService(t, nil, startChunkServer(t)))
}

// TestEtcdLockManyLocksSessionClose is TestLockManyLocksSessionClose over
// etcd with its default --max-txn-ops (128).
func TestEtcdLockManyLocksSessionClose(t *testing.T) {
	srv := etcdtest.Start(t)
	checkManyLocksClose(t, openService(t, openEtcd(t, srv, "/locks/"), startChunkServer(t)))
}

func checkManyLocksClose(t *testing.T, s *Service) {
	t.Helper()
	var envs []*lockEnv
	for range 4 {
		envs = append(envs, newLockEnv(t, s))
	}
	a, b := envs[0].session("a"), envs[0].session("b")
	total := 0
	for i, e := range envs {
		n := 30 + 30*i // 30, 60, 90, 120 (the last one hits the limit)
		for j := range uint64(n) {
			_, err := s.SetLock(e.ctx, e.req(a, j%3+1, wr, j*10, j*10+4, false))
			if errnoOf(t, err) == syscall.ENOLCK {
				if int(j) != maxLocksPerInode {
					t.Fatalf("ENOLCK at lock %d of inode %d, want it at %d", j, e.ino, maxLocksPerInode)
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			total++
		}
		if _, err := s.SetLock(e.ctx, e.req(a, 7, rd, 0, 0, true)); err != nil {
			t.Fatal(err)
		}
		total++
	}
	if got := lockCount(t, s, a); int(got) != total {
		t.Fatalf("session holds %d locks, want %d", got, total)
	}
	if _, err := s.CloseSession(context.Background(), &weftv1.CloseSessionRequest{Session: a}); err != nil {
		t.Fatalf("close a session with %d locks: %v", total, err)
	}
	if n := countKeys(t, s, prefixLock) + countKeys(t, s, prefixSessLock); n != 0 {
		t.Fatalf("%d lock keys left after the session closed", n)
	}
	for _, e := range envs {
		if _, err := s.SetLock(e.ctx, e.req(b, 1, wr, 0, lockEOF, false)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEtcdLocksAcrossServices: two meta services over one etcd share
// locks; a waiter on one is granted the lock released through the other
// (by polling: no local wake-up crosses services).
func TestEtcdLocksAcrossServices(t *testing.T) {
	srv := etcdtest.Start(t)
	data := startChunkServer(t)
	s1 := openService(t, openEtcd(t, srv, "/shared/"), data)
	s2 := openService(t, openEtcd(t, srv, "/shared/"), nil)
	e1 := newLockEnv(t, s1)
	a := e1.session("a")
	e2 := &lockEnv{t: t, s: s2, ctx: e1.ctx, ino: e1.ino}
	b := e2.session("b")
	if _, err := s1.SetLock(e1.ctx, e1.req(a, 1, wr, 0, 99, false)); err != nil {
		t.Fatal(err)
	}
	resp, err := s2.GetLock(e2.ctx, e2.req(b, 2, rd, 50, 50, false))
	if err != nil || resp.Type != wr || resp.Pid != 100 {
		t.Fatalf("F_GETLK through the other service: %+v, %v; want the write lock of pid 100", resp, err)
	}
	_, err = s2.SetLock(e2.ctx, e2.req(b, 2, rd, 50, 50, false))
	wantErrno(t, err, syscall.EAGAIN)
	done := make(chan error, 1)
	go func() {
		req := e2.req(b, 2, wr, 0, 0, false)
		req.Wait = true
		_, err := s2.SetLock(e2.ctx, req)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("waiter returned while the lock is held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := s1.SetLock(e1.ctx, e1.req(a, 1, un, 0, lockEOF, false)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter on the other service: %v", err)
	}
}
