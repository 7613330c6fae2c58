package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Replica choice for reads.
const (
	rttAlpha = 0.2 // weight of a new sample in the latency average
	// rttHalfLife: a latency not measured again fades by half in this
	// time, so a replica that was slow (or unlucky) once is tried again,
	// the sooner the nearer it was.
	rttHalfLife = 500 * time.Millisecond
	// rttSlack: replicas within this of the fastest (or within nearRatio
	// of it) count as equally near, and share the load: the latency of a
	// read of a MiB varies that much on a busy machine.
	rttSlack  = 2 * time.Millisecond
	nearRatio = 3.0
	// rttOutlier: a sample counts for at most this many times the
	// average (see observeAt), so the average of a replica that became
	// slow grows by at most 1.6 times a read.
	rttOutlier = 4.0
	// rttRefBytes: latency samples are scaled to reads of this size.
	rttRefBytes = 128 << 10
	// downFor: a data server that refused a connection is avoided by
	// reads for this long (while others serve).
	downFor = time.Second
)

// serverStat is what the client measured of one data server address.
type serverStat struct {
	outstanding atomic.Int64 // reads under way

	mu        sync.Mutex
	rtt       time.Duration // moving average of read latency
	at        time.Time     // of the last sample
	downUntil time.Time
	// floor is the smallest read latency, as measured (not scaled by
	// size), of the samples since floorAt; a new period starts with the
	// first sample after floorPeriod. Any read costs at least a round
	// trip, so the floor approaches it.
	floor   time.Duration
	floorAt time.Time
}

// floorPeriod is how long a latency floor holds before the next sample
// starts a new one (the link may have changed).
const floorPeriod = 2 * time.Second

// stat returns the statistics of the data server at addr.
func (t *chainTable) stat(addr string) *serverStat {
	t.statsMu.Lock()
	defer t.statsMu.Unlock()
	s := t.stats[addr]
	if s == nil {
		s = &serverStat{}
		t.stats[addr] = s
	}
	return s
}

// observe adds the latency d of a read of n bytes. Reads larger than
// rttRefBytes count per rttRefBytes, so that the large pieces of a
// growing read-ahead window do not make a replica look far away.
func (s *serverStat) observe(d time.Duration, n int) {
	s.observeAt(time.Now(), d, n)
}

func (s *serverStat) observeAt(now time.Time, d time.Duration, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.floor == 0 || d < s.floor || now.Sub(s.floorAt) > floorPeriod {
		if s.floor == 0 || now.Sub(s.floorAt) > floorPeriod {
			s.floorAt = now
		}
		s.floor = d
	}
	if n > rttRefBytes {
		d = time.Duration(float64(d) * rttRefBytes / float64(n))
	}
	if prev := s.faded(now); prev == 0 {
		s.rtt = d
	} else {
		// One read stalled (a pause of either process, a busy core)
		// must not send the replica away for seconds: a sample counts
		// for at most rttOutlier times the average, or twice the
		// floor (which a new period starts afresh, so a replica that
		// is far indeed is seen at once).
		limit := max(time.Duration(rttOutlier*float64(prev)), 2*s.floor, rttSlack)
		s.rtt = time.Duration(rttAlpha*float64(min(d, limit)) + (1-rttAlpha)*float64(prev))
	}
	s.at = now
	s.downUntil = time.Time{}
}

// roundTrip is the server's latency floor (about its round trip), or 0
// when no read has been measured for two periods.
func (s *serverStat) roundTrip(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.floorAt) > 2*floorPeriod {
		return 0
	}
	return s.floor
}

// nearestRoundTrip is the round trip of the nearest serving member of ch
// whose round trip is known (0: none is).
func (t *chainTable) nearestRoundTrip(ch *weftv1.Chain) time.Duration {
	now := time.Now()
	var best time.Duration
	for _, m := range ch.Members {
		if !serving(m) {
			continue
		}
		if rt := t.stat(m.Address).roundTrip(now); rt > 0 && (best == 0 || rt < best) {
			best = rt
		}
	}
	return best
}

// markDown makes reads avoid the server for a while.
func (s *serverStat) markDown() {
	s.mu.Lock()
	s.downUntil = time.Now().Add(downFor)
	s.mu.Unlock()
}

// faded is the latency average faded by the time since its last sample.
// Called with s.mu held.
func (s *serverStat) faded(now time.Time) time.Duration {
	if s.rtt == 0 {
		return 0
	}
	return time.Duration(float64(s.rtt) * math.Exp2(-float64(now.Sub(s.at))/float64(rttHalfLife)))
}

// view returns the server's current latency (0: unknown) and whether it
// is to be avoided.
func (s *serverStat) view(now time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faded(now), now.Before(s.downUntil)
}

// candidate is a serving member considered for a read.
type candidate struct {
	m    *weftv1.ChainMember
	st   *serverStat
	rtt  time.Duration
	down bool
}

// pickReader chooses the serving member of ch to read from, skipping the
// addresses in tried: among the members not known to be down, those about
// as near as the nearest (measured read latency), and of those the one of
// two random ones with fewer reads outstanding, so that load spreads over
// equally near replicas. A chain with no serving member gets
// its head (see head); nil when every choice was tried.
func (t *chainTable) pickReader(ch *weftv1.Chain, tried map[string]bool) *weftv1.ChainMember {
	now := time.Now()
	var cands []candidate
	anyServing := false
	for _, m := range ch.Members {
		if !serving(m) {
			continue
		}
		anyServing = true
		if tried[m.Address] {
			continue
		}
		st := t.stat(m.Address)
		rtt, down := st.view(now)
		cands = append(cands, candidate{m: m, st: st, rtt: rtt, down: down})
	}
	if !anyServing {
		if m := head(ch); m != nil && !tried[m.Address] {
			return m
		}
		return nil
	}
	switch len(cands) {
	case 0:
		return nil
	case 1:
		return cands[0].m
	}
	up := cands[:0:0]
	for _, c := range cands {
		if !c.down {
			up = append(up, c)
		}
	}
	if len(up) > 0 {
		cands = up
	}
	best := cands[0].rtt
	for _, c := range cands[1:] {
		best = min(best, c.rtt)
	}
	near := cands[:0:0]
	limit := time.Duration(float64(best)*nearRatio) + rttSlack
	for _, c := range cands {
		if c.rtt <= limit {
			near = append(near, c)
		}
	}
	if len(near) == 1 {
		return near[0].m
	}
	i := rand.IntN(len(near))
	j := rand.IntN(len(near) - 1)
	if j >= i {
		j++
	}
	if near[j].st.outstanding.Load() < near[i].st.outstanding.Load() {
		i = j
	}
	return near[i].m
}

// readChunk fills p from chunk idx at offset off; what the chunk does not
// hold reads as zeros. It reads from a serving member chosen by
// pickReader; a member that answers EIO (a bad copy, which the data server
// then repairs), is unreachable or refuses (stale table, not serving) is
// passed over for the next one at once. Only when every serving member
// failed does it wait (stalled) and start again on a refreshed table; EIO
// reaches the caller only when every serving replica answered EIO.
func (c *Client) readChunk(ctx context.Context, ino uint64, l *weftv1.Layout, idx, off uint64, p []byte) error {
	return c.readChunkTo(ctx, ino, l, idx, off, len(p), p, func(data []byte) {
		n := len(data)
		if n == 0 || &data[0] != &p[0] { // not received in place
			n = copy(p, data)
		}
		clear(p[n:])
	})
}

// readChunkOwned reads n bytes of chunk idx at offset off into a pooled
// buffer (wire.GetBuffer) that it returns, zeros past what the server
// has; give it back with wire.PutBuffer.
func (c *Client) readChunkOwned(ctx context.Context, ino uint64, l *weftv1.Layout, idx, off uint64, n int) ([]byte, error) {
	buf := wire.GetBuffer(n)
	if err := c.readChunk(ctx, ino, l, idx, off, buf); err != nil {
		wire.PutBuffer(buf)
		return nil, err
	}
	return buf, nil
}

// readChunkTo reads n bytes of chunk idx at offset off and hands what the
// server sent (perhaps shorter: the rest reads as zeros) to sink. With
// dst (n bytes) the data may be received into dst.
func (c *Client) readChunkTo(ctx context.Context, ino uint64, l *weftv1.Layout, idx, off uint64, n int,
	dst []byte, sink func([]byte)) error {
	chain := chainFor(l, idx)
	what := fmt.Sprintf("read chunk %d of file %d", idx, ino)
	backoff := firstBackoff
	quick := true
	tried := map[string]bool{}
	bad := map[string]error{}
	var lastAddr string
	var lastErr error
	for {
		ch, err := c.chains.lookup(ctx, chain, what)
		if err != nil {
			return err
		}
		m := c.chains.pickReader(ch, tried)
		if m == nil {
			if err := allBad(ch, bad); err != nil {
				return fmt.Errorf("%s: every serving replica of chain %d has a bad copy: %w", what, chain, err)
			}
			if lastErr == nil {
				lastErr = errChainNotServing
			}
			if err := c.stalled(ctx, chain, ch, what, lastAddr, lastErr, &backoff); err != nil {
				return err
			}
			clear(tried)
			clear(bad)
			continue
		}
		if c.chains.freshFor(ctx, ch, m) {
			continue
		}
		addr := m.Address
		st := c.chains.stat(addr)
		st.outstanding.Add(1)
		start := time.Now()
		err = c.attempt(ctx, chain, ch.Version, m, func(ctx context.Context, dc dataServer) error {
			data, err := dc.ReadChunkInto(ctx, &weftv1.ReadChunkRequest{
				Chunk: &weftv1.ChunkID{Ino: ino, Index: idx}, ChainId: chain, ChainVersion: ch.Version,
				Offset: off, Length: uint32(n),
			}, dst)
			if err != nil {
				return err
			}
			sink(data)
			return nil
		})
		st.outstanding.Add(-1)
		if err == nil {
			st.observe(time.Since(start), n)
			c.chains.recovered(chain)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		tried[addr] = true
		lastAddr, lastErr = addr, err
		switch {
		case errors.Is(err, syscall.EIO):
			bad[addr] = err
			c.log.Warn("bad copy of a chunk on a data server (it repairs it from another replica); reading another replica",
				"op", what, "chain", chain, "server", addr, "err", err)
		case isCode(err, codes.FailedPrecondition):
			if quick {
				quick = false
				c.chains.refreshIfStale(ctx, chain, ch.Version)
				if nch := c.chains.get(chain); nch != nil && nch.Version != ch.Version {
					clear(tried)
				}
			}
		case isCode(err, codes.Unavailable):
			st.markDown()
		default:
			return dataError(what, addr, err)
		}
	}
}

// allBad returns one of the errors if every serving member of ch answered
// EIO (recorded in bad by address), else nil.
func allBad(ch *weftv1.Chain, bad map[string]error) error {
	var first error
	for _, m := range ch.Members {
		if !serving(m) {
			continue
		}
		err, ok := bad[m.Address]
		if !ok {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}
