package meta

import (
	"context"
	"sync"
	"time"

	"github.com/weft-fs/weft/meta/kv"
)

// Update groups. The calls of a batch (batch.go) run concurrently, and
// each reaches its transaction at its own moment; handed to the engine
// one by one they would mostly commit in groups of one or two, each with
// its own sync and wake-ups. An updateGroup holds the transactions of a
// batch's calls until every call still running is waiting for its
// transaction, then hands them all to the engine at once (UpdateAll),
// so a batch commits together. A call that is busy elsewhere (a view, the
// cluster manager) keeps the others waiting at most groupLinger.

// groupLinger bounds how long a batch's transactions wait for the batch's
// calls that are busy elsewhere.
const groupLinger = 2 * time.Millisecond

type updateGroupKey struct{}

// updateGroup gathers the transactions of one batch's calls.
type updateGroup struct {
	eng kv.GroupUpdater

	mu      sync.Mutex
	running int           // calls of the batch not yet finished
	held    []*heldUpdate // transactions waiting to be handed over
	timer   *time.Timer   // hands them over after groupLinger
}

// heldUpdate is one transaction waiting in a group.
type heldUpdate struct {
	ctx  context.Context
	fn   func(kv.Txn) error
	done chan error
}

func newUpdateGroup(eng kv.GroupUpdater, calls int) *updateGroup {
	return &updateGroup{eng: eng, running: calls}
}

// updateGroupOf returns the group of ctx's batch, or nil.
func updateGroupOf(ctx context.Context) *updateGroup {
	g, _ := ctx.Value(updateGroupKey{}).(*updateGroup)
	return g
}

// update runs fn in a transaction of the group and returns its outcome.
func (g *updateGroup) update(ctx context.Context, fn func(kv.Txn) error) error {
	h := &heldUpdate{ctx: ctx, fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.held = append(g.held, h)
	if len(g.held) == 1 {
		g.timer = time.AfterFunc(groupLinger, g.handOver)
	}
	ready := len(g.held) >= g.running
	g.mu.Unlock()
	if ready {
		g.handOver()
	}
	return <-h.done
}

// callDone notes that one of the batch's calls finished.
func (g *updateGroup) callDone() {
	g.mu.Lock()
	g.running--
	ready := len(g.held) > 0 && len(g.held) >= g.running
	g.mu.Unlock()
	if ready {
		g.handOver()
	}
}

// handOver gives the held transactions to the engine together and their
// outcomes to their callers.
func (g *updateGroup) handOver() {
	g.mu.Lock()
	held := g.held
	g.held = nil
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	g.mu.Unlock()
	if len(held) == 0 {
		return
	}
	ctxs := make([]context.Context, len(held))
	fns := make([]func(kv.Txn) error, len(held))
	for i, h := range held {
		ctxs[i], fns[i] = h.ctx, h.fn
	}
	for i, err := range g.eng.UpdateAll(ctxs, fns) {
		held[i].done <- err
	}
}
