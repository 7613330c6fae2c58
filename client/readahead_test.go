package client

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestContinues checks which reads continue a stream: the next request,
// one that came ahead of a request of its size, one that came behind, and
// not a skip or a read far back.
func TestContinues(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name         string
		next, off, n uint64
		want         bool
	}{
		{"next request", 8 * mib, 8 * mib, mib, true},
		{"a little back", 8 * mib, 8*mib - 64<<10, mib, true},
		{"one request ahead", 8 * mib, 9 * mib, mib, true},
		{"one request behind the one ahead", 10 * mib, 8 * mib, mib, true},
		{"two requests ahead", 8 * mib, 10 * mib, mib, false},
		{"skip of 4 MiB", 4 * mib, 8 * mib, mib, false},
		{"far back", 8 * mib, 4 * mib, mib, false},
		{"small reads, 256 KiB gap", 8 * mib, 8*mib + 256<<10 + 8<<10, 8 << 10, true},
		{"small reads, 1 MiB gap", 8 * mib, 9 * mib, 8 << 10, false},
		{"start of the file", 0, 0, 128 << 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := continues(tt.next, tt.off, tt.n); got != tt.want {
				t.Errorf("continues(next %d, off %d, n %d) = %v, want %v", tt.next, tt.off, tt.n, got, tt.want)
			}
		})
	}
}

// TestWindowGrowth checks the window against what a stream has read: an
// eighth of it in general, half of it for a file's first stream from its
// start, a power of two from 128 KiB to the limit.
func TestWindowGrowth(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name   string
		seq    uint64
		growth uint64
		limit  int64
		want   uint64
	}{
		{"first MiB", mib, raGrowth, 8 * mib, 128 << 10},
		{"under the smallest window", 512 << 10, raGrowth, 8 * mib, 0},
		{"16 MiB", 16 * mib, raGrowth, 8 * mib, 2 * mib},
		{"16 MiB from the start", 16 * mib, raGrowth0, 8 * mib, 8 * mib},
		{"12 MiB from the start", 12 * mib, raGrowth0, 8 * mib, 4 * mib},
		{"capped", 1 << 30, raGrowth, 8 * mib, 8 * mib},
		{"smaller limit", 16 * mib, raGrowth0, 1 * mib, 1 * mib},
		{"read-ahead off", 16 * mib, raGrowth, -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := raWindowFor(tt.seq, tt.growth, tt.limit); got != tt.want {
				t.Errorf("raWindowFor(%d, %d, %d) = %d, want %d", tt.seq, tt.growth, tt.limit, got, tt.want)
			}
		})
	}
}

func TestFarScale(t *testing.T) {
	for _, tc := range []struct {
		rt   time.Duration
		want int64
	}{
		{0, 1},
		{time.Millisecond, 1},
		{4900 * time.Microsecond, 1},
		{5 * time.Millisecond, 1},
		{10 * time.Millisecond, 2},
		{20 * time.Millisecond, 4},
		{40 * time.Millisecond, 8},
		{time.Second, 8},
	} {
		if got := farScale(tc.rt); got != tc.want {
			t.Errorf("farScale(%v) = %d, want %d", tc.rt, got, tc.want)
		}
	}
}

// TestServerRoundTrip checks the latency floor: the smallest read latency
// of a period, a new period after floorPeriod, nothing once stale.
func TestServerRoundTrip(t *testing.T) {
	var s serverStat
	t0 := time.Now()
	steps := []struct {
		at   time.Duration // since t0
		d    time.Duration // a read's latency (0: none, only look)
		want time.Duration
	}{
		{0, 30 * time.Millisecond, 30 * time.Millisecond},
		{time.Second, 20 * time.Millisecond, 20 * time.Millisecond},
		{1500 * time.Millisecond, 25 * time.Millisecond, 20 * time.Millisecond},
		// A new period: the link may have changed.
		{2500 * time.Millisecond, 40 * time.Millisecond, 40 * time.Millisecond},
		{3 * time.Second, 0, 40 * time.Millisecond},
		// No read for two periods: not known any more.
		{7 * time.Second, 0, 0},
	}
	for _, st := range steps {
		now := t0.Add(st.at)
		if st.d > 0 {
			s.observeAt(now, st.d, 1<<20)
		}
		if got := s.roundTrip(now); got != st.want {
			t.Errorf("at %v: round trip %v, want %v", st.at, got, st.want)
		}
	}
}

// TestReadAheadGrowsFarFromServers reads a file whose data servers are
// behind a 10 ms delay each way: a sequential reader's window grows past
// Config.ReadAheadBytes (farScale), as one window per round trip would
// cap its rate at the window per 20 ms. Near servers keep the limit
// (TestReadAheadAdaptive).
func TestReadAheadGrowsFarFromServers(t *testing.T) {
	const size = 48 << 20
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 1}
	tc := startClusterOpts(t, layout, 2, clusterOpts{latency: 10 * time.Millisecond})
	ctx := context.Background()
	c := newTestClient(t, tc.metaAddr, Config{ReadAheadBytes: 4 << 20})
	model := randomBytes(rand.New(rand.NewPCG(31, 32)), size)
	writeFile(t, c, "far", model)
	g, _ := open(t, c, "far", syscall.O_RDONLY)
	defer g.Release(ctx)
	buf := make([]byte, 1<<20)
	for off := 0; off < size; off += len(buf) {
		if _, err := g.ReadAt(ctx, buf, int64(off)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, model[off:off+len(buf)]) {
			t.Fatalf("read at %d: bytes differ", off)
		}
	}
	in := c.lookupInode(g.Ino())
	in.mu.Lock()
	maxWin, limit := in.raState.maxWindow, in.raState.limit
	in.mu.Unlock()
	t.Logf("largest window %d MiB, limit %d MiB", maxWin>>20, limit>>20)
	if maxWin <= 4<<20 {
		t.Errorf("largest read-ahead window %d KiB with data servers 20 ms away; want more than the configured 4 MiB", maxWin>>10)
	}
}

// TestReadAheadBudget reads four files at once, sequentially, through
// the servers: their windows together stay within the client's budget
// (raBudgetWindows windows; here set lower), and the files read right.
func TestReadAheadBudget(t *testing.T) {
	const (
		size   = 24 << 20
		files  = 4
		budget = 6 << 20
	)
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	ctx := context.Background()
	c := newTestClient(t, tc.metaAddr, Config{ReadAheadBytes: 8 << 20, NoLocalReads: true})
	c.raBudget = budget
	rnd := rand.New(rand.NewPCG(33, 34))
	models := make([][]byte, files)
	for i := range models {
		models[i] = randomBytes(rnd, size)
		writeFile(t, c, fmt.Sprintf("f%d", i), models[i])
	}
	var wg sync.WaitGroup
	errs := make(chan error, files)
	for i := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, _ := open(t, c, fmt.Sprintf("f%d", i), syscall.O_RDONLY)
			defer g.Release(ctx)
			buf := make([]byte, 1<<20)
			for off := 0; off < size; off += len(buf) {
				if _, err := g.ReadAt(ctx, buf, int64(off)); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf, models[i][off:off+len(buf)]) {
					errs <- fmt.Errorf("file %d at %d: bytes differ", i, off)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	peak := c.raPeak.Load()
	t.Logf("read-ahead windows held at most %d KiB together (budget %d KiB)", peak>>10, budget>>10)
	if peak == 0 {
		t.Fatal("no read-ahead at all")
	}
	if peak > budget+raMaxPiece {
		t.Errorf("read-ahead windows held %d KiB together; budget %d KiB (and one piece of %d KiB)", peak>>10, budget>>10, raMaxPiece>>10)
	}
}
