package data

import (
	"sync"
	"sync/atomic"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// forwardFailures follows the chain members on this server that fail to
// pass mutations on to the next member (it is unreachable): writes to
// those chains fail until the next member is reachable again or the
// cluster manager takes it out. The heartbeat reports them, so that the
// manager's status says so (it cannot see a link between two data
// servers it hears from). A success of the member's next forward, or a
// new version of the chain, clears a failure; so does a quiet spell of
// forwardFailureMemory without another failure (nobody writes to the
// chain: whether writes would fail is not known any more).
type forwardFailures struct {
	n  atomic.Int32 // len(m), read without the lock on every forward
	mu sync.Mutex
	m  map[forwardKey]*forwardFailure
}

// forwardKey is a member: chain and target.
type forwardKey struct{ chain, target uint64 }

type forwardFailure struct {
	version     uint64
	next        *weftv1.ChainMember
	err         string
	since, last time.Time
}

// forwardFailureMemory is how long a forward failure is reported without
// another one.
const forwardFailureMemory = 10 * time.Second

// failed records that member m could not reach next.
func (f *forwardFailures) failed(m member, next *weftv1.ChainMember, err string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[forwardKey]*forwardFailure)
	}
	k := forwardKey{m.view.id, m.targetID}
	ff := f.m[k]
	if ff == nil || ff.version != m.view.version || ff.next.GetTargetId() != next.GetTargetId() {
		ff = &forwardFailure{version: m.view.version, next: next, since: time.Now()}
		f.m[k] = ff
	}
	ff.err, ff.last = err, time.Now()
	f.n.Store(int32(len(f.m)))
}

// ok records that member m passed a mutation on.
func (f *forwardFailures) ok(m member) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, forwardKey{m.view.id, m.targetID})
	f.n.Store(int32(len(f.m)))
}

// dropStale forgets failures of chain versions other than the views'.
func (f *forwardFailures) dropStale(views map[uint64]*chainView) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, ff := range f.m {
		if v := views[k.chain]; v == nil || v.version != ff.version {
			delete(f.m, k)
		}
	}
	f.n.Store(int32(len(f.m)))
}

// report lists the failures for a heartbeat.
func (f *forwardFailures) report() []*weftv1.ForwardFailure {
	if f.n.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*weftv1.ForwardFailure, 0, len(f.m))
	for k, ff := range f.m {
		if time.Since(ff.last) > forwardFailureMemory {
			delete(f.m, k)
			continue
		}
		out = append(out, &weftv1.ForwardFailure{
			ChainId: k.chain, ChainVersion: ff.version, TargetId: k.target,
			NextTargetId: ff.next.GetTargetId(), NextServerId: ff.next.GetServerId(), NextAddress: ff.next.GetAddress(),
			Error: ff.err, FailingMs: time.Since(ff.since).Milliseconds(),
		})
	}
	f.n.Store(int32(len(f.m)))
	return out
}
