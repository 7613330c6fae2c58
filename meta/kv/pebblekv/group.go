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

// commitGroup runs the group's transactions in order on one indexed batch
// and commits that batch with one sync. A transaction whose function fails
// leaves the batch as it was before it: if it had written anything, the
// batch is rebuilt from the writes of the transactions that succeeded so
// far. Every request of the group gets its outcome only after the sync.
func (e *Engine) commitGroup(group []*request) {
	results := make([]error, len(group))
	gb := e.db.NewIndexedBatch()
	var kept []*pebble.Batch // writes of the successful transactions, in order
	var keptIdx []int
	defer func() {
		for _, b := range kept {
			b.Close()
		}
	}()
	for i, r := range group {
		if gb.Len() > maxGroupBytes && len(kept) > 0 {
			// Too big already: commit what we have, requeue the rest.
			e.requeue(group[i:])
			group, results = group[:i], results[:i]
			break
		}
		if err := r.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		rec := e.db.NewBatch()
		err := r.fn(&txn{r: gb, w: gb, rec: rec})
		if err != nil {
			results[i] = err
			if !rec.Empty() {
				gb.Close()
				gb = e.db.NewIndexedBatch()
				for _, b := range kept {
					if aerr := gb.Apply(b, nil); aerr != nil {
						panic(fmt.Sprintf("pebblekv: rebuilding a commit group: %v", aerr))
					}
				}
			}
			rec.Close()
			continue
		}
		if rec.Empty() {
			rec.Close()
			continue
		}
		kept = append(kept, rec)
		keptIdx = append(keptIdx, i)
	}
	if !gb.Empty() {
		if err := gb.Commit(pebble.Sync); err != nil {
			err = fmt.Errorf("commit metadata transaction: %w", err)
			for _, i := range keptIdx {
				results[i] = err
			}
		}
	}
	gb.Close()
	e.groups++
	e.txns += uint64(len(group))
	for i, r := range group {
		r.done <- results[i]
	}
}

// requeue puts requests back at the head of the queue.
func (e *Engine) requeue(rs []*request) {
	e.mu.Lock()
	e.queue = append(append([]*request(nil), rs...), e.queue...)
	e.mu.Unlock()
}
