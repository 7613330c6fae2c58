package client

import (
	"context"
	"sync"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Replaying opens.
//
// The meta service may record opens lazily (meta/replay.go): a crash of
// it can lose the latest, and its answers to session calls then carry a
// new epoch. The client counts the files it has open (openTable) and,
// when the epoch changes, sends them with its next renewal; when it has
// to open a new session (the old one expired while the meta service was
// out of reach) it sends them with the new session, so its open files
// stay protected from deletion by another client's unlink.
//
// The list a replay sends is complete (the meta service sets the
// session's records to it), so it must count every open the meta service
// acknowledged and every release it has not applied, queued ones
// included, or a file would lose its record or keep one nobody releases:
// opens hold replayMu shared from their call until the file is counted,
// releases from the count's drop until they are queued or their call is
// answered (queued ones while sent), and a replay holds it alone.

// openTable counts the files the client has open with the meta service.
type openTable struct {
	replayMu sync.RWMutex // see above

	mu sync.Mutex
	n  map[uint64]uint32 // open count by inode
	// moved maps a session to the one its opens were replayed into, so
	// a file opened in the old one is released in the new one.
	moved map[string]string
}

// add counts one more open of ino.
func (t *openTable) add(ino uint64) {
	t.mu.Lock()
	if t.n == nil {
		t.n = make(map[uint64]uint32)
	}
	t.n[ino]++
	t.mu.Unlock()
}

// remove counts one open of ino, made in session sess, less, and returns
// the session to release it in.
func (t *openTable) remove(ino uint64, sess string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := t.n[ino]; n > 1 {
		t.n[ino] = n - 1
	} else {
		delete(t.n, ino)
	}
	for range len(t.moved) { // each move is followed once at most
		next, ok := t.moved[sess]
		if !ok {
			break
		}
		sess = next
	}
	return sess
}

// snapshot returns the counts with queued, the releases not sent yet,
// added, for a replay. Called with replayMu held.
func (t *openTable) snapshot(queued map[uint64]uint32) []*weftv1.OpenCount {
	t.mu.Lock()
	defer t.mu.Unlock()
	counts := make(map[uint64]uint32, len(t.n)+len(queued))
	for ino, n := range t.n {
		counts[ino] += n
	}
	for ino, n := range queued {
		counts[ino] += n
	}
	out := make([]*weftv1.OpenCount, 0, len(counts))
	for ino, n := range counts {
		out = append(out, &weftv1.OpenCount{Ino: ino, Count: n})
	}
	return out
}

// queuedReleases counts the releases of session sess waiting in the
// queue, by inode.
func (c *Client) queuedReleases(sess string) map[uint64]uint32 {
	r := &c.rel
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[uint64]uint32)
	for _, q := range r.queue {
		if q.Session == sess {
			out[q.Ino]++
			for _, ino := range q.MoreInos {
				out[ino]++
			}
		}
	}
	return out
}

// noteMoved records that the opens of session from now live in to.
func (t *openTable) noteMoved(from, to string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.moved == nil {
		t.moved = make(map[string]string)
	}
	t.moved[from] = to
}

// OpenFiles returns how many files the client counts as open with the
// meta service (each open once).
func (c *Client) OpenFiles() int {
	c.opens.mu.Lock()
	defer c.opens.mu.Unlock()
	n := 0
	for _, k := range c.opens.n {
		n += int(k)
	}
	return n
}

// replayOpens sends the client's open files to the meta service in a
// renewal of session sess, after its epoch changed to epoch; on success
// the epoch is the one the client knows.
func (c *Client) replayOpens(ctx context.Context, sess, epoch string) error {
	c.opens.replayMu.Lock()
	defer c.opens.replayMu.Unlock()
	reopen := c.opens.snapshot(c.queuedReleases(sess))
	resp, err := c.meta.RenewSession(ctx, &weftv1.RenewSessionRequest{Session: sess, Reopen: reopen, Replay: true})
	if err != nil {
		return err
	}
	c.sessionMu.Lock()
	c.epoch = resp.GetEpoch()
	c.sessionMu.Unlock()
	c.log.Info("meta service restarted; replayed the open files", "session", sess, "files", len(reopen), "epoch", epoch)
	return nil
}

// noteEpoch handles a renewal of session sess whose answer named epoch
// now where the client knew was: the meta service restarted. If it
// records opens lazily, the client replays its opens (retried at the
// next renewal if that fails).
func (c *Client) noteEpoch(sess, was, now string, timeout time.Duration) {
	if now == "" {
		c.sessionMu.Lock()
		c.epoch = ""
		c.sessionMu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(c.bg, timeout)
	defer cancel()
	if err := c.replayOpens(ctx, sess, now); err != nil && c.bg.Err() == nil {
		c.log.Warn("meta service restarted; replaying the open files failed, retrying at the next renewal",
			"session", sess, "was", was, "now", now, "err", err)
	}
}
