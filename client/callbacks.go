package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Callback stream reconnection backoff.
const (
	watchBackoffMin = 100 * time.Millisecond
	watchBackoffMax = 5 * time.Second
	// forgetBatch is the most inodes one Forget call carries; forgetDelay
	// is how long forgotten inodes gather before they are sent.
	forgetBatch = 1024
	forgetDelay = 200 * time.Millisecond
)

// callbackState is the client's side of the meta service's callbacks: the
// Watch stream, whether it is live, and the Forget batch.
type callbackState struct {
	mu      sync.Mutex
	hook    func(*weftv1.Invalidation)
	started bool
	on      atomic.Bool // started, read without the lock
	// live is true while a Watch stream is up and its first message
	// (Invalidation.all) has been delivered: only then are callbacks
	// trustworthy and long cache timeouts safe.
	live atomic.Bool

	fmu      sync.Mutex
	forgets  []uint64
	inFlight map[uint64]bool // inodes of the Forget call being sent
	reseen   []uint64        // of those, seen again in a reply meanwhile
	fwake    chan struct{}
	pending  atomic.Int64 // len(forgets)+len(inFlight), read without the lock

	// metaCalls counts namespace calls to the meta service.
	metaCalls atomic.Uint64
	// commits counts CommitWrite calls (lengths and mtimes of writes).
	commits atomic.Uint64
}

// MetaCalls returns how many namespace calls (lookups, getattrs, listings,
// creates, opens, releases, ...) this client has sent to the meta
// service: a metadata read answered from a cache sends none.
func (c *Client) MetaCalls() uint64 { return c.cb.metaCalls.Load() }

// CommitsSent reports how many CommitWrite calls (a written file's length
// and mtime) this client sent; a file made under a delegation whose
// create was not sent yet has them stored with its create instead.
func (c *Client) CommitsSent() uint64 { return c.cb.commits.Load() }

// countMeta counts one namespace call.
func (c *Client) countMeta() { c.cb.metaCalls.Add(1) }

// CallbacksLive reports whether the meta service's callbacks currently
// reach this client: a Watch stream is up and has been synchronized. When
// false, whoever caches metadata must use short timeouts.
func (c *Client) CallbacksLive() bool { return c.cb.live.Load() }

// WatchCallbacks subscribes the client to the meta service's callbacks:
// fn is called, one call at a time from a goroutine of the client, with
// every Invalidation the meta service sends for this client's session.
// fn gets Invalidation.all when the stream (re)starts and when it breaks:
// then everything cached must go, and until the stream is back
// CallbacksLive is false. The stream reconnects with backoff (also to
// another meta server after a failover) and follows a new session. Only
// the first call has an effect; the stream ends with Close.
func (c *Client) WatchCallbacks(fn func(*weftv1.Invalidation)) {
	c.cb.mu.Lock()
	defer c.cb.mu.Unlock()
	if c.cb.started || fn == nil {
		return
	}
	c.cb.started, c.cb.hook = true, fn
	c.cb.on.Store(true)
	c.cb.fwake = make(chan struct{}, 1)
	c.cb.inFlight = make(map[uint64]bool)
	c.wg.Add(2)
	go c.watchLoop()
	go c.forgetLoop()
}

// watchLoop keeps a Watch stream open until Close.
func (c *Client) watchLoop() {
	defer c.wg.Done()
	backoff := watchBackoffMin
	for c.bg.Err() == nil {
		start := time.Now()
		err := c.watchOnce()
		wasLive := c.cb.live.Swap(false)
		if c.bg.Err() != nil {
			return
		}
		if wasLive {
			// Changes may go unseen from now on: drop what is cached.
			c.deliver(&weftv1.Invalidation{All: true})
			c.log.Warn("metadata callback stream from the meta service broke; using short cache timeouts until it is back",
				"meta", c.cfg.MetaAddr, "err", err)
		}
		if time.Since(start) > 10*time.Second {
			backoff = watchBackoffMin
		}
		d := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, watchBackoffMax)
		select {
		case <-c.bg.Done():
			return
		case <-time.After(d):
		}
	}
}

// watchOnce runs one Watch stream until it breaks or the session changes.
func (c *Client) watchOnce() error {
	sess := c.Session()
	ctx, cancel := context.WithCancel(c.bg)
	defer cancel()
	// A new session (the old one expired) needs a new stream.
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if c.Session() != sess {
					cancel()
					return
				}
			}
		}
	}()
	stream, err := c.meta.Watch(ctx, &weftv1.WatchRequest{Session: sess})
	if err != nil {
		return err
	}
	for {
		inv, err := stream.Recv()
		if err != nil {
			return err
		}
		c.deliver(inv)
		if inv.All && !c.cb.live.Load() {
			c.cb.live.Store(true)
			c.log.Debug("metadata callback stream up", "session", sess)
		}
	}
}

// deliver applies a callback to the client's own caches, then hands it
// to the hook.
func (c *Client) deliver(inv *weftv1.Invalidation) {
	c.dropNoXattrs(inv)
	c.handleRecalls(inv)
	c.dirs.invalidate(inv)
	c.layoutHints.invalidate(inv)
	c.dropReadCaches(inv)
	c.cb.hook(inv)
}

// dropReadCaches forgets what this client fetched ahead or opened in place
// of the files a callback names (every file for Invalidation.all): the
// next read gets what the data servers hold now.
func (c *Client) dropReadCaches(inv *weftv1.Invalidation) {
	var ins []*inode
	c.inodesMu.Lock()
	if inv.All {
		for _, in := range c.inodes {
			ins = append(ins, in)
		}
	} else {
		for _, ino := range inv.Inodes {
			if in := c.inodes[ino]; in != nil {
				ins = append(ins, in)
			}
		}
	}
	c.inodesMu.Unlock()
	for _, in := range ins {
		in.mu.Lock()
		in.dropReadAheadLocked()
		in.mu.Unlock()
	}
}

// callbackSession is the session a call without a Caller names
// (GetAttrRequest.session): this client's when callbacks are on, else "".
func (c *Client) callbackSession() string {
	if !c.cb.on.Load() {
		return ""
	}
	return c.Session()
}

// Forget tells the meta service that inodes are no longer cached here
// (the kernel forgot them), so it stops calling back about them. Calls
// are batched and sent in the background.
func (c *Client) Forget(inos ...uint64) {
	if !c.cb.on.Load() || len(inos) == 0 {
		return
	}
	// A file whose attributes are kept stays known to the meta service
	// (its Forget goes once it leaves the cache, filecache.go).
	send := inos[:0:0]
	for _, ino := range inos {
		if !c.dirs.forgetFile(ino) {
			send = append(send, ino)
		}
	}
	c.sendForget(send...)
}

// sendForget queues Forget calls: the meta service stops calling back
// about inos, so a directory among them is no longer known completely.
func (c *Client) sendForget(inos ...uint64) {
	if len(inos) == 0 {
		return
	}
	c.dirs.changed(inos...)
	c.queueForget(inos...)
}

// queueForget queues Forget calls of inos for the background sender
// (without touching the directory cache: its release calls it).
func (c *Client) queueForget(inos ...uint64) {
	c.cb.fmu.Lock()
	c.cb.forgets = append(c.cb.forgets, inos...)
	c.cb.pending.Add(int64(len(inos)))
	c.cb.fmu.Unlock()
	select {
	case c.cb.fwake <- struct{}{}:
	default:
	}
}

// seen notes that a reply about ino arrived (the meta service registered
// interest in it again): a Forget of ino still waiting is dropped, and
// one in flight is undone after it returns.
func (c *Client) seen(ino uint64) {
	if c.cb.pending.Load() == 0 {
		return
	}
	c.cb.fmu.Lock()
	defer c.cb.fmu.Unlock()
	for i := 0; i < len(c.cb.forgets); i++ {
		if c.cb.forgets[i] == ino {
			c.cb.forgets[i] = c.cb.forgets[len(c.cb.forgets)-1]
			c.cb.forgets = c.cb.forgets[:len(c.cb.forgets)-1]
			c.cb.pending.Add(-1)
			i--
		}
	}
	if c.cb.inFlight[ino] {
		c.cb.reseen = append(c.cb.reseen, ino)
	}
}

// forgetLoop sends batched Forget calls until Close.
func (c *Client) forgetLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.bg.Done():
			return
		case <-c.cb.fwake:
		}
		select {
		case <-c.bg.Done():
			return
		case <-time.After(forgetDelay):
		}
		for c.sendForgets() {
		}
	}
}

// sendForgets sends one batch; false when nothing was left.
func (c *Client) sendForgets() bool {
	c.cb.fmu.Lock()
	n := min(len(c.cb.forgets), forgetBatch)
	if n == 0 {
		c.cb.fmu.Unlock()
		return false
	}
	batch := append([]uint64(nil), c.cb.forgets[:n]...)
	c.cb.forgets = c.cb.forgets[n:]
	for _, ino := range batch {
		c.cb.inFlight[ino] = true
	}
	c.cb.fmu.Unlock()
	ctx, cancel := context.WithTimeout(c.bg, 10*time.Second)
	_, err := c.meta.Forget(ctx, &weftv1.ForgetRequest{Session: c.Session(), Inodes: batch})
	cancel()
	if err != nil && c.bg.Err() == nil {
		c.log.Debug("forget call to the meta service failed (only extra callbacks follow)", "err", err)
	}
	// What was learned about them while the Forget was in flight may no
	// longer be called back.
	c.dirs.changed(batch...)
	c.cb.fmu.Lock()
	reseen := c.cb.reseen
	c.cb.reseen = nil
	clear(c.cb.inFlight)
	c.cb.pending.Add(-int64(n))
	c.cb.fmu.Unlock()
	// A reply that raced with the Forget may have had its interest
	// dropped by it: register it again.
	for _, ino := range reseen {
		ctx, cancel := context.WithTimeout(c.bg, 10*time.Second)
		_, _ = c.getAttr(ctx, ino)
		cancel()
	}
	return true
}
