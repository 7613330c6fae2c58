package etcdkv

import (
	"context"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-fs/weft/meta/kv"
)

// Watch implements kv.Watcher with an etcd watch on the prefix. Events are
// passed on per etcd revision (one committed transaction). If the watch
// is cut off it resumes from the next revision not yet seen; if that
// revision was compacted away, or the engine cannot tell where to resume,
// it resumes at the latest revision and reports Lost.
func (e *Engine) Watch(ctx context.Context, prefix []byte, fn func(kv.WatchEvent)) error {
	full := e.prefix + string(prefix)
	var next int64 // revision to resume from; 0: now
	backoff := 50 * time.Millisecond
	for {
		if e.closed.Load() {
			return kv.ErrClosed
		}
		if next == 0 {
			// Start (or start over) at the current revision, so that a
			// watch cut off before its first event resumes without a gap.
			rev, err := e.currentRevision(ctx, full)
			if err == nil {
				next = rev + 1
			}
		}
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if next > 0 {
			opts = append(opts, clientv3.WithRev(next))
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		ch := e.cli.Watch(wctx, full, opts...)
		lost := false
		for resp := range ch {
			if resp.CompactRevision > 0 {
				// Resuming from next is impossible: history is gone.
				next = 0
				lost = true
				break
			}
			if err := resp.Err(); err != nil {
				break
			}
			backoff = 50 * time.Millisecond
			var changes []kv.Change
			var rev int64
			for _, ev := range resp.Events {
				r := ev.Kv.ModRevision
				if r != rev && len(changes) > 0 {
					fn(kv.WatchEvent{Changes: changes})
					changes = nil
				}
				rev = r
				c := kv.Change{Key: ev.Kv.Key[len(e.prefix):]}
				if ev.Type == clientv3.EventTypeDelete {
					c.Deleted = true
				} else {
					c.Value = ev.Kv.Value
				}
				changes = append(changes, c)
			}
			if len(changes) > 0 {
				fn(kv.WatchEvent{Changes: changes})
				next = rev + 1
			}
		}
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if lost || next == 0 {
			fn(kv.WatchEvent{Lost: true})
		}
		d := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, 2*time.Second)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// currentRevision is the store's latest revision.
func (e *Engine) currentRevision(ctx context.Context, key string) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, e.opts.RequestTimeout)
	defer cancel()
	resp, err := e.cli.Get(cctx, key, clientv3.WithCountOnly())
	if err != nil {
		return 0, e.wrap(ctx, "read the current revision", err)
	}
	return resp.Header.Revision, nil
}

var _ kv.Watcher = (*Engine)(nil)
