package client

import (
	"context"
	"sync"
	"time"
)

// attemptWatch follows the requests waiting for a data server (see
// attempt) with one goroutine for all of them, instead of a timer per
// request: every watchInterval, while requests wait, it refreshes the
// chain table (at most once for all of them) and gives up on every
// request that has waited at least one interval for a member that is no
// longer serving in a newer version of its chain.
type attemptWatch struct {
	mu      sync.Mutex
	waiting map[*waitingAttempt]struct{}
	tick    uint64 // intervals passed
	running bool   // the watching goroutine runs
}

// waitingAttempt is one request being watched.
type waitingAttempt struct {
	id, version uint64
	addr        string
	since       uint64 // tick at which it started
	cancel      context.CancelCauseFunc
}

// watch starts watching a request to the member at addr of chain id at
// version; cancel gives up on it. Pass the result to unwatch when the
// request is done.
func (c *Client) watch(id, version uint64, addr string, cancel context.CancelCauseFunc) *waitingAttempt {
	w := &c.attempts
	a := &waitingAttempt{id: id, version: version, addr: addr, cancel: cancel}
	w.mu.Lock()
	if w.waiting == nil {
		w.waiting = make(map[*waitingAttempt]struct{})
	}
	a.since = w.tick
	w.waiting[a] = struct{}{}
	start := !w.running
	w.running = true
	w.mu.Unlock()
	if start {
		go c.watchAttempts()
	}
	return a
}

// unwatch stops watching a.
func (c *Client) unwatch(a *waitingAttempt) {
	c.attempts.mu.Lock()
	delete(c.attempts.waiting, a)
	c.attempts.mu.Unlock()
}

// watchAttempts checks the waiting requests every watchInterval until
// none waits or the client closes.
func (c *Client) watchAttempts() {
	w := &c.attempts
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	var old []*waitingAttempt
	for {
		select {
		case <-t.C:
		case <-c.bg.Done():
			w.mu.Lock()
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		if len(w.waiting) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.tick++
		old = old[:0]
		for a := range w.waiting {
			if a.since+1 < w.tick { // waited a whole interval at least
				old = append(old, a)
			}
		}
		w.mu.Unlock()
		if len(old) == 0 {
			continue
		}
		rctx, rcancel := context.WithTimeout(c.bg, watchInterval)
		c.chains.refreshSoon(rctx)
		rcancel()
		for _, a := range old {
			if ch := c.chains.get(a.id); ch == nil || (ch.Version != a.version && !servingAt(ch, a.addr)) {
				c.unwatch(a)
				a.cancel(errLeftChain)
			}
		}
		clear(old)
	}
}
