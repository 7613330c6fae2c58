package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// watchInterval is how often a request still waiting for a data server
// checks the chain table: a member the cluster manager took out of the
// chain (dead, or cut off by the network) is abandoned and the request
// goes to the chain's new members.
const watchInterval = time.Second

// errLeftChain cancels a request to a member that left its chain.
var errLeftChain = errors.New("the data server left the chain")

// errChainNotServing is what a chain without a member to send to reports
// while the client waits for one to come back.
var errChainNotServing = errors.New("no member of the chain has an address")

// serving reports whether m may take client reads (and, if first, writes).
func serving(m *weftv1.ChainMember) bool {
	return (m.State == "" || m.State == "serving") && m.Address != ""
}

// head picks the member of a chain that takes mutations: the first serving
// one, else the first with an address (with one replica the meta service
// may not have noticed yet that the server is back; the server itself
// refuses what it cannot take).
func head(ch *weftv1.Chain) *weftv1.ChainMember {
	for _, m := range ch.Members {
		if serving(m) {
			return m
		}
	}
	for _, m := range ch.Members {
		if m.Address != "" {
			return m
		}
	}
	return nil
}

// servingAt reports whether the data server at addr is a serving member
// of ch.
func servingAt(ch *weftv1.Chain, addr string) bool {
	for _, m := range ch.Members {
		if serving(m) && m.Address == addr {
			return true
		}
	}
	return false
}

// retryable reports whether a data server's error means the chain table
// may be stale or the server is (for now) unreachable.
func retryable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.FailedPrecondition, codes.Unavailable:
		return true
	}
	return false
}

// isCode reports whether err is a gRPC status error with code.
func isCode(err error, code codes.Code) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == code
}

// attempt runs one request against member m of chain id, sent
// with the chain at version. While it waits the chain table is re-read
// every watchInterval (see attemptWatch) and it gives up on a member that is no longer serving
// in a newer version of the chain (a server cut off by the network never
// answers; the manager takes it out after its failure timeout): the
// request then fails with Unavailable and is retried on the new members.
// Resending is safe: a write carries the same bytes for the same offset.
func (c *Client) attempt(ctx context.Context, id, version uint64, m *weftv1.ChainMember,
	fn func(ctx context.Context, dc dataServer) error) error {
	addr := m.Address
	dc, err := c.chains.memberClient(m)
	if err != nil {
		return fmt.Errorf("chain %d: %v: %w", id, err, syscall.EIO)
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a := c.watch(id, version, addr, cancel)
	err = fn(actx, dc)
	c.unwatch(a)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errLeftChain) {
		return status.Errorf(codes.Unavailable, "data server %s left chain %d while the request waited (%v): retry on the new members",
			addr, id, err)
	}
	return err
}

// onChain runs fn against the head of chain id (its first serving member)
// with the chain's current version: writes and syncs. A stale chain
// version refreshes the table and retries at once; an unreachable head is
// retried with backoff on a refreshed table until the cluster manager has
// replaced it (see stalled for chains with no serving member).
func (c *Client) onChain(ctx context.Context, id uint64, what string,
	fn func(ctx context.Context, dc dataServer, version uint64) error) error {
	backoff := firstBackoff
	quick := true
	for {
		ch, err := c.chains.lookup(ctx, id, what)
		if err != nil {
			return err
		}
		var addr string
		if m := head(ch); m == nil {
			err = errChainNotServing
		} else if c.chains.freshFor(ctx, ch, m) {
			continue
		} else {
			addr = m.Address
			err = c.attempt(ctx, id, ch.Version, m, func(ctx context.Context, dc dataServer) error {
				return fn(ctx, dc, ch.Version)
			})
			if err == nil {
				c.chains.recovered(id)
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !retryable(err) {
				return dataError(what, addr, err)
			}
			if isCode(err, codes.FailedPrecondition) && quick {
				// Stale table, or not the head any more: one retry at
				// once on a fresh table; a server that has not caught up
				// with the new version yet gets the backoff.
				quick = false
				c.chains.refreshIfStale(ctx, id, ch.Version)
				continue
			}
		}
		if err := c.stalled(ctx, id, ch, what, addr, err, &backoff); err != nil {
			return err
		}
	}
}

// outage is a chain whose requests are failing: since when, and what was
// logged about it.
type outage struct {
	start  time.Time
	last   time.Time // of the latest failure
	logged bool      // the outage was reported
	failed bool      // OnUnavailable "fail" gave up on the chain
}

// outageOfLocked returns chain id's outage, starting one now if none is
// under way. An outage without failures for quiet (its requests were
// abandoned, nobody tried since) is over: a new one starts. Called with
// t.outMu held.
func (t *chainTable) outageOfLocked(id uint64, now time.Time, quiet time.Duration) *outage {
	o := t.outages[id]
	if o != nil && now.Sub(o.last) > quiet {
		o = nil
		t.outN.Add(-1)
	}
	if o == nil {
		o = &outage{start: now}
		t.outages[id] = o
		t.outN.Add(1)
	}
	o.last = now
	return o
}

// outageStart is when chain id's outage began, now if it has none.
func (t *chainTable) outageStart(id uint64, now time.Time) time.Time {
	if t.outN.Load() == 0 {
		return now
	}
	t.outMu.Lock()
	defer t.outMu.Unlock()
	if o := t.outages[id]; o != nil {
		return o.start
	}
	return now
}

// inOutage reports whether requests on chain id are failing.
func (t *chainTable) inOutage(id uint64) bool {
	if t.outN.Load() == 0 {
		return false
	}
	t.outMu.Lock()
	defer t.outMu.Unlock()
	return t.outages[id] != nil
}

// recovered ends chain id's outage, if it had one, after a request on it
// succeeded.
func (t *chainTable) recovered(id uint64) {
	if t.outN.Load() == 0 {
		return
	}
	t.outMu.Lock()
	o := t.outages[id]
	if o != nil {
		delete(t.outages, id)
		t.outN.Add(-1)
	}
	t.outMu.Unlock()
	if o != nil && o.logged {
		t.c.log.Warn(fmt.Sprintf("chain %d is available again after %v", id, time.Since(o.start).Round(time.Millisecond)),
			"chain", id)
	}
}

// stalled handles a round of requests on chain id that found no member to
// take it (err: the last member's answer, from addr). It records the
// chain's outage, logs it once, and sleeps the backoff (refreshing the
// table afterwards); nil means retry. With Config.OnUnavailable "fail" a
// chain failing for Config.UnavailableTimeout fails every request with
// EIO until one succeeds again; with "wait" requests wait for the chain
// until their context ends.
func (c *Client) stalled(ctx context.Context, id uint64, ch *weftv1.Chain, what, addr string, err error,
	backoff *time.Duration) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	now := time.Now()
	wait := c.cfg.OnUnavailable == OnUnavailableWait
	t := &c.chains
	if !wait && now.Sub(t.outageStart(id, now)) >= c.cfg.UnavailableTimeout {
		// About to fail at once: first look at the chain table again
		// (every failure does): a chain that changed since (its servers
		// back, perhaps at other addresses) is tried again on its new
		// members instead.
		t.refreshSoon(ctx)
		if nch := t.get(id); nch != nil && nch.Version != ch.Version {
			return nil
		}
		now = time.Now()
	}
	t.outMu.Lock()
	o := t.outageOfLocked(id, now, max(c.cfg.UnavailableTimeout, 5*time.Second))
	age := now.Sub(o.start)
	var logMsg string
	logAsError := false
	lone := loneFailure(ch, addr)
	if !o.logged && (lone || age >= time.Second) {
		o.logged = true
		switch {
		case lone && wait:
			logMsg = fmt.Sprintf("chain %d has no serving replica (%s); waiting for it (--on-unavailable=wait)",
				id, describeDown(ch, addr, err))
		case lone:
			logMsg = fmt.Sprintf("chain %d has no serving replica (%s); I/O on it fails with EIO if it is not back within %v (--on-unavailable=fail)",
				id, describeDown(ch, addr, err), c.cfg.UnavailableTimeout)
		default:
			logMsg = fmt.Sprintf("chain %d: request to its data server %s failed (%s); retrying until the cluster manager has taken the failed member out of the chain",
				id, addr, errMessage(err))
		}
	}
	giveUp := !wait && age >= c.cfg.UnavailableTimeout
	if giveUp && !o.failed {
		o.failed = true
		logAsError = true
		logMsg = fmt.Sprintf("chain %d has had no serving replica for %v (%s); failing I/O on it with EIO until it is back (--on-unavailable=fail)",
			id, age.Round(time.Millisecond), describeDown(ch, addr, err))
	}
	t.outMu.Unlock()
	if logMsg != "" {
		if logAsError {
			c.log.Error(logMsg, "chain", id, "op", what)
		} else {
			c.log.Warn(logMsg, "chain", id, "op", what)
		}
	}
	if giveUp {
		return fmt.Errorf("%s: chain %d has had no serving replica for %v (%s); start its data server again or check `weft status` (--on-unavailable=wait waits instead): %w",
			what, id, age.Round(time.Millisecond), describeDown(ch, addr, err), syscall.EIO)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(*backoff):
	}
	*backoff = min(*backoff*2, maxBackoff)
	t.refreshSoon(ctx)
	return nil
}

// loneFailure reports whether the chain has no serving member left to
// turn to once the one at addr failed: its only replica is down, or none
// is serving.
func loneFailure(ch *weftv1.Chain, addr string) bool {
	for _, m := range ch.Members {
		if serving(m) && m.Address != addr {
			return false
		}
	}
	return true
}

// describeDown says which data server failed and how, for log lines and
// errors.
func describeDown(ch *weftv1.Chain, addr string, err error) string {
	if addr == "" {
		var states []string
		for _, m := range ch.Members {
			states = append(states, fmt.Sprintf("target %d on %s %s", m.TargetId, m.Address, m.State))
		}
		return "members: " + strings.Join(states, ", ")
	}
	why := "down"
	if !isCode(err, codes.Unavailable) {
		why = "not ready"
	}
	return fmt.Sprintf("data server %s %s: %s", addr, why, errMessage(err))
}

// errMessage is the message of a data server's error without the gRPC
// decoration.
func errMessage(err error) string {
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	return strings.TrimPrefix(msg, "connection error: desc = ")
}

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
