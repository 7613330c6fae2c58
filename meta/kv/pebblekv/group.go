package pebblekv

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/weft-fs/weft/meta/kv"
)

// Limits of one commit group: a group takes what is queued when the
// committer gets to it, up to this many transactions or bytes of batch;
// the rest waits for the next group.
const (
	maxGroupTxns  = 1024
	maxGroupBytes = 16 << 20
)

// request is one queued Update.
type request struct {
	ctx  context.Context
	fn   func(kv.Txn) error
	done chan error // receives the outcome once
	idx  int        // position in an UpdateAll
}

// commitLoop is the committer goroutine: it takes what is queued, commits
// it as one group, and repeats; transactions queued while a group syncs
// form the next group. After Close it fails what is still queued and
// exits.
func (e *Engine) commitLoop() {
	defer close(e.done)
	for {
		e.mu.Lock()
		closed := e.closed
		var group []*request
		if !closed {
			n := min(len(e.queue), maxGroupTxns)
			group = e.queue[:n:n]
			e.queue = e.queue[n:]
		}
		if closed || len(e.queue) == 0 {
			// Let the backing array go: the next Update starts afresh.
			for _, r := range e.queue {
				r.done <- kv.ErrClosed
			}
			e.queue = nil
		}
		e.mu.Unlock()
		if closed {
			return
		}
		if len(group) == 0 {
			<-e.wake
			continue
		}
		e.commitGroup(group)
	}
}

// commitGroup runs the group's transactions in order, each seeing the
// writes of those before it, and commits what the successful ones wrote
// as one batch with one sync. A transaction whose function fails leaves
// nothing behind. Every request of the group gets its outcome only after
// the sync. A group whose writers are all lazy (kv.Lazy) commits without
// a sync; its writes become durable with the next group that syncs.
func (e *Engine) commitGroup(group []*request) {
	results := make([]error, len(group))
	gw := newGroupWrites()
	var wrote []int // the transactions that wrote something
	sync := false   // one of them is not lazy
	for i, r := range group {
		if gw.bytes > maxGroupBytes && len(wrote) > 0 {
			// Too big already: commit what we have, requeue the rest.
			e.requeue(group[i:])
			group, results = group[:i], results[:i]
			break
		}
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		if err := r.fn(&txn{gw: gw, e: e}); err != nil {
			gw.drop()
			results[i] = err
			continue
		}
		if gw.keep() {
			wrote = append(wrote, i)
			sync = sync || !kv.IsLazy(r.ctx)
		}
	}
	if len(gw.group) > 0 {
		if err := e.commitWrites(gw, sync); err != nil {
			for _, i := range wrote {
				results[i] = err
			}
			e.cache.reset() // what the database holds now is not known
		} else {
			for k, w := range gw.group {
				e.cache.update(k, w.v, w.deleted)
			}
		}
	}
	e.groups++
	e.txns += uint64(len(group))
	for i, r := range group {
		r.done <- results[i]
	}
}

// commitWrites writes a group's final key states in one batch, synced if
// sync.
func (e *Engine) commitWrites(gw *groupWrites, sync bool) error {
	b := e.db.NewBatch()
	defer b.Close()
	for k, w := range gw.group {
		var err error
		if w.deleted {
			err = b.Delete([]byte(k), nil)
		} else {
			err = b.Set([]byte(k), w.v, nil)
		}
		if err != nil {
			return fmt.Errorf("commit metadata transaction: %w", err)
		}
	}
	opt := pebble.Sync
	if !sync {
		opt = pebble.NoSync
		e.lazyGroups.Add(1)
	}
	if err := b.Commit(opt); err != nil {
		return fmt.Errorf("commit metadata transaction: %w", err)
	}
	return nil
}

// requeue puts requests back at the head of the queue.
func (e *Engine) requeue(rs []*request) {
	e.mu.Lock()
	e.queue = append(append([]*request(nil), rs...), e.queue...)
	e.mu.Unlock()
}
