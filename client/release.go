package client

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Background release limits.
const (
	// releaseQueue is how many releases may wait; past it Release sends
	// its own at once (so a burst of closes defers little work).
	releaseQueue = 256
	// releaseWorkers is how many releases are sent at once.
	releaseWorkers = 4
	// releaseRetryFor is how long a release is retried on transient
	// errors (the meta service restarting, a failover) before it is
	// given up: the session's end cleans up what it leaves.
	releaseRetryFor = 2 * time.Minute
	// releaseDrainFor bounds how long Close waits for queued releases.
	releaseDrainFor = 30 * time.Second
	// releaseLinger is how long a worker that found releases queued
	// waits for more before it sends them in one call: a process that
	// opens and closes files one after another (a build, a scan of small
	// files) would otherwise cost the meta service one call per close.
	releaseLinger = 2 * time.Millisecond
)

// releaser sends the meta service's Release calls of closed files in the
// background: the file's data and length are committed before, so nobody
// waits for the open record to go.
type releaser struct {
	mu      sync.Mutex
	cond    *sync.Cond // signals queue changes and idle workers
	queue   []*weftv1.ReleaseRequest
	busy    int           // releases being sent
	started bool          // workers running
	closed  bool          // Close began: no more queueing
	sent    atomic.Uint64 // files released with the meta service
	linger  time.Duration // releaseLinger; tests set it longer

	// ctx ends when Close stops waiting for the releases.
	ctx    context.Context
	cancel context.CancelFunc
}

// releaseLater queues the meta release of ino by session, or sends it now
// when the queue is full or closed. Errors of a queued release are logged.
// Called with c.opens.replayMu held shared.
func (c *Client) releaseLater(ctx context.Context, ino uint64, session string) error {
	req := &weftv1.ReleaseRequest{Ino: ino, Session: session}
	r := &c.rel
	r.mu.Lock()
	if r.closed || len(r.queue) >= releaseQueue {
		r.mu.Unlock()
		return c.sendReleaseLocked(ctx, req)
	}
	if !r.started {
		r.started = true
		r.cond = sync.NewCond(&r.mu)
		r.ctx, r.cancel = context.WithCancel(context.Background())
		for range releaseWorkers {
			c.wg.Add(1)
			go c.releaseWorker()
		}
	}
	r.queue = append(r.queue, req)
	r.cond.Signal()
	r.mu.Unlock()
	return nil
}

// sendReleaseLocked sends one release with the meta service. Called with
// c.opens.replayMu held shared, so no replay runs meanwhile (replay.go).
func (c *Client) sendReleaseLocked(ctx context.Context, req *weftv1.ReleaseRequest) error {
	c.countMeta()
	if _, err := c.meta.Release(ctx, req); err != nil {
		if len(req.MoreInos) > 0 {
			return fmt.Errorf("release files %d and %d more with the meta service: %w", req.Ino, len(req.MoreInos), err)
		}
		return fmt.Errorf("release file %d with the meta service: %w", req.Ino, err)
	}
	c.rel.sent.Add(uint64(1 + len(req.MoreInos)))
	return nil
}

// releaseWorker sends queued releases until the client is closed and the
// queue is empty.
func (c *Client) releaseWorker() {
	defer c.wg.Done()
	r := &c.rel
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && !r.closed {
			r.cond.Wait()
		}
		if len(r.queue) == 0 {
			r.mu.Unlock()
			return
		}
		linger := time.Duration(0)
		if !r.closed && len(r.queue) < releaseBatch {
			linger = cmp.Or(r.linger, releaseLinger)
		}
		r.mu.Unlock()
		time.Sleep(linger)
		// A release is counted by a replay while queued, so it is taken
		// from the queue and sent with no replay in between (replay.go).
		c.opens.replayMu.RLock()
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.mu.Unlock()
			c.opens.replayMu.RUnlock()
			continue
		}
		req := r.takeBatchLocked()
		r.busy++
		r.mu.Unlock()

		c.releaseWithRetry(req)
		c.opens.replayMu.RUnlock()

		r.mu.Lock()
		r.busy--
		r.cond.Broadcast()
		r.mu.Unlock()
	}
}

// releaseBatch is the most releases one Release call carries.
const releaseBatch = 32

// takeBatchLocked takes the first queued release and the releases of the
// same session queued after it (up to releaseBatch in all), as one
// request. Called with r.mu held and the queue not empty.
func (r *releaser) takeBatchLocked() *weftv1.ReleaseRequest {
	first := r.queue[0]
	req := &weftv1.ReleaseRequest{Ino: first.Ino, Session: first.Session}
	keep := r.queue[:0]
	for i, q := range r.queue {
		switch {
		case i == 0:
		case q.Session == req.Session && len(req.MoreInos) < releaseBatch-1:
			req.MoreInos = append(req.MoreInos, q.Ino)
		default:
			keep = append(keep, q)
		}
	}
	clear(r.queue[len(keep):])
	r.queue = keep
	return req
}

// releaseWithRetry sends req, retrying transient errors for a while.
// Called with c.opens.replayMu held shared.
func (c *Client) releaseWithRetry(req *weftv1.ReleaseRequest) {
	deadline := time.Now().Add(releaseRetryFor)
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithDeadline(withBackground(c.rel.ctx), deadline)
		err := c.sendReleaseLocked(ctx, req)
		cancel()
		if err == nil {
			return
		}
		if !transientRelease(err) || time.Now().Add(backoff).After(deadline) || c.rel.ctx.Err() != nil {
			c.log.Warn("release of a closed file failed; the session's end will clean it up",
				"ino", req.Ino, "err", err)
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
	}
}

// transientRelease reports whether a failed release is worth sending
// again: the meta service was unreachable or cut the call off.
func transientRelease(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

// drainReleases stops queueing and waits (at most releaseDrainFor) until
// every queued release was sent.
func (c *Client) drainReleases() {
	r := &c.rel
	r.mu.Lock()
	r.closed = true
	if !r.started {
		r.mu.Unlock()
		return
	}
	r.cond.Broadcast()
	timer := time.AfterFunc(releaseDrainFor, func() {
		r.mu.Lock()
		if n := len(r.queue); n > 0 {
			c.log.Warn("gave up waiting for releases of closed files; the session's end cleans them up", "left", n)
			r.queue = nil
		}
		r.cancel()
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	for len(r.queue) > 0 || r.busy > 0 {
		r.cond.Wait()
	}
	r.mu.Unlock()
	r.cancel()
}

// ReleasesSent returns how many files were released with the meta
// service so far (several may go in one call).
func (c *Client) ReleasesSent() uint64 { return c.rel.sent.Load() }

// PendingReleases returns how many meta releases of closed files are
// queued or being sent.
func (c *Client) PendingReleases() int {
	r := &c.rel
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue) + r.busy
}
