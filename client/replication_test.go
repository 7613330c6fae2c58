package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Failure detection of the replication test clusters: short, so tests
// see a failover in a few seconds.
const testFailureTimeout = 1500 * time.Millisecond

// startReplicated runs nData proxied data servers with the given default
// layout and waits until every chain of the layout's width has all its
// members serving.
func startReplicated(t *testing.T, layout *weftv1.Layout, nData int) *testCluster {
	t.Helper()
	tc := startClusterOpts(t, layout, nData, clusterOpts{failureTimeout: testFailureTimeout, proxied: true})
	tc.waitHealthy(layout.Replicas, nData)
	return tc
}

// chainTable fetches the cluster's chain table.
func (tc *testCluster) chainTable() (*weftv1.ChainTable, error) {
	cc, err := rpc.Dial(tc.metaAddr)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(tc.ctx, 5*time.Second)
	defer cancel()
	return weftv1.NewMetaClient(cc).GetChains(ctx, &weftv1.GetChainsRequest{})
}

// waitHealthy waits until at least n chains of width r exist with r
// serving members each.
func (tc *testCluster) waitHealthy(r uint32, n int) {
	tc.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tab, err := tc.chainTable()
		healthy := 0
		for _, ch := range tab.GetChains() {
			if ch.Replicas != r || len(ch.Members) != int(r) {
				continue
			}
			ok := true
			for _, m := range ch.Members {
				ok = ok && m.State == "serving"
			}
			if ok {
				healthy++
			}
		}
		if err == nil && healthy >= n {
			return
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("chains of width %d not healthy in time: %v (err %v)", r, tab, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serverOf returns the index of the data server advertising addr, or -1.
func (tc *testCluster) serverOf(addr string) int {
	for i, p := range tc.proxies {
		if (p != nil && p.addr() == addr) || (p == nil && tc.DataAddr(i) == addr) {
			return i
		}
	}
	return -1
}

// chunkPath is where data server i keeps chunk idx of inode ino.
func (tc *testCluster) chunkPath(i int, ino, idx uint64) string {
	return filepath.Join(tc.dataDirs[i], "chunks", fmt.Sprintf("%02x", ino%256), strconv.FormatUint(ino, 16),
		strconv.FormatUint(idx, 10)+".w")
}

// members returns the data server indexes holding the chunks of chain id.
func (tc *testCluster) members(id uint64) []int {
	tc.t.Helper()
	tab, err := tc.chainTable()
	if err != nil {
		tc.t.Fatal(err)
	}
	for _, ch := range tab.Chains {
		if ch.Id == id {
			var out []int
			for _, m := range ch.Members {
				out = append(out, tc.serverOf(m.Address))
			}
			return out
		}
	}
	tc.t.Fatalf("chain %d not in the table", id)
	return nil
}

func replicated(chunk uint32, stripes uint32) *weftv1.Layout {
	return &weftv1.Layout{ChunkSize: chunk, StripeCount: stripes, Replicas: 3}
}

// TestReplicatedWriteSurvivesServerLoss streams writes to a file with 3
// replicas on 4 data servers and takes one of them away in the middle:
// stopped (its connections cut at once, as a killed process), or cut off
// (its connections hang unanswered, as in a network partition, and it
// stops heartbeating). No write, flush or close may fail, the longest stall
// must stay within the failure timeout plus a few seconds, and the file
// must read back intact.
func TestReplicatedWriteSurvivesServerLoss(t *testing.T) {
	for _, partition := range []bool{false, true} {
		name := "stopped"
		if partition {
			name = "partitioned"
		}
		t.Run(name, func(t *testing.T) { testServerLoss(t, partition) })
	}
}

func testServerLoss(t *testing.T, partition bool) {
	tc := startReplicated(t, replicated(256<<10, 4), 4)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	f := create(t, c, "stream", syscall.O_RDWR)
	const total, piece, flushEvery = 24 << 20, 64 << 10, 1 << 20
	want := randomBytes(rand.New(rand.NewPCG(1, 2)), total)

	var (
		stall   time.Duration
		stopped = make(chan struct{})
	)
	for off := 0; off < total; off += piece {
		if off == total/3 {
			// Stop a server that heads one of the file's chains.
			victim := tc.members(f.in.layout.Chains[0])[0]
			if partition {
				tc.proxies[victim].blackhole()
			}
			go func() {
				tc.stopData(victim)
				close(stopped)
			}()
			t.Logf("stopped data server %d at offset %d", victim, off)
		}
		start := time.Now()
		if _, err := f.WriteAt(ctx, want[off:off+piece], int64(off)); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
		if (off+piece)%flushEvery == 0 {
			if err := f.Flush(ctx); err != nil {
				t.Fatalf("flush at %d: %v", off+piece, err)
			}
		}
		stall = max(stall, time.Since(start))
	}
	if err := f.Release(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	<-stopped
	t.Logf("longest write/flush stall while a data server died: %v (failure timeout %v)", stall, testFailureTimeout)
	if limit := testFailureTimeout + 5*time.Second; stall > limit {
		t.Errorf("a write stalled %v, more than the failure timeout plus 5 s (%v)", stall, limit)
	}

	r := newTestClient(t, tc.metaAddr, Config{})
	g, a := open(t, r, "stream", syscall.O_RDONLY)
	defer g.Release(ctx)
	if a.Size != total {
		t.Fatalf("size %d, want %d", a.Size, total)
	}
	if got := readAll(t, g, total, 1<<20); !bytes.Equal(got, want) {
		t.Fatal("the file reads back wrong after a data server died mid-stream")
	}
}

// TestReadBadCopy corrupts chunk files on some replicas: a read must return
// the good bytes of the remaining replica, and fail with EIO only for a
// chunk whose every replica is bad.
func TestReadBadCopy(t *testing.T) {
	tc := startReplicated(t, replicated(64<<10, 4), 4)
	w := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	f := create(t, w, "f", syscall.O_WRONLY)
	const chunks = 16
	want := randomBytes(rand.New(rand.NewPCG(3, 4)), chunks*64<<10)
	if _, err := f.WriteAt(ctx, want, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ino, layout := f.Ino(), f.in.layout
	const allBadChunk = 5
	for idx := range uint64(chunks) {
		ms := tc.members(chainFor(layout, idx))
		if len(ms) != 3 {
			t.Fatalf("chunk %d: chain members %v", idx, ms)
		}
		n := 2 // all replicas but one
		if idx == allBadChunk {
			n = 3
		}
		for _, i := range ms[:n] {
			corrupt(t, tc.chunkPath(i, ino, idx))
		}
	}

	r := newTestClient(t, tc.metaAddr, Config{})
	g, _ := open(t, r, "f", syscall.O_RDONLY)
	defer g.Release(ctx)
	buf := make([]byte, 64<<10)
	for idx := range chunks {
		n, err := g.ReadAt(ctx, buf, int64(idx)*int64(len(buf)))
		if idx == allBadChunk {
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("chunk %d, bad on every replica: read gave %d bytes, err %v; want EIO", idx, n, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("chunk %d, good on one replica: %v", idx, err)
		}
		if !bytes.Equal(buf[:n], want[idx*len(buf):(idx+1)*len(buf)]) {
			t.Fatalf("chunk %d reads wrong bytes", idx)
		}
	}
	tc.fsckFindsOnlyCorruptChunks()
}

// corrupt flips bytes in the middle of a chunk file.
func corrupt(t *testing.T, path string) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("corrupt chunk: %v", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil || st.Size() < 2 {
		t.Fatalf("corrupt chunk %s: size %v, err %v", path, st.Size(), err)
	}
	// The middle of the chunk's bytes, after the file's head (byte 7 of
	// its header is where they start, in 64 KiB).
	var head [8]byte
	fh.ReadAt(head[:], 0)
	dataOff := int64(head[7]) << 16
	b := make([]byte, 16)
	off := dataOff + (st.Size()-dataOff)/2
	n, _ := fh.ReadAt(b, off)
	for i := range b[:n] {
		b[i] ^= 0xff
	}
	if _, err := fh.WriteAt(b[:n], off); err != nil {
		t.Fatal(err)
	}
}

// TestReadSpreadsAndPrefersNear reads a file striped over one chain of 3
// replicas: the reads must spread over the replicas, and once one replica
// is made slow (its proxy delays its answers), go to the other two.
func TestReadSpreadsAndPrefersNear(t *testing.T) {
	tc := startReplicated(t, replicated(1<<20, 1), 3)
	w := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	f := create(t, w, "f", syscall.O_WRONLY)
	const size = 8 << 20
	want := randomBytes(rand.New(rand.NewPCG(5, 6)), size)
	if _, err := f.WriteAt(ctx, want, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	members := tc.members(f.in.layout.Chains[0])

	r := newTestClient(t, tc.metaAddr, Config{})
	// readPasses reads the file passes times with 4 readers and returns
	// the bytes each member's data server sent.
	readPasses := func(passes int) []float64 {
		before := make([]int64, len(tc.proxies))
		for i, p := range tc.proxies {
			before[i] = p.sent.Load()
		}
		for range passes {
			var wg sync.WaitGroup
			for k := range 4 {
				wg.Go(func() {
					g, _ := open(t, r, "f", syscall.O_RDONLY)
					defer g.Release(ctx)
					buf := make([]byte, 128<<10)
					for off := k * size / 4; off < (k+1)*size/4; off += len(buf) {
						n, err := g.ReadAt(ctx, buf, int64(off))
						if err != nil || !bytes.Equal(buf[:n], want[off:off+n]) {
							t.Errorf("read at %d: %d bytes, err %v, or wrong bytes", off, n, err)
							return
						}
					}
				})
			}
			wg.Wait()
		}
		sent := make([]float64, len(members))
		for j, i := range members {
			sent[j] = float64(tc.proxies[i].sent.Load() - before[i])
		}
		return sent
	}
	shareOf := func(sent []float64) []float64 {
		var sum float64
		for _, b := range sent {
			sum += b
		}
		shares := make([]float64, len(sent))
		for j, b := range sent {
			shares[j] = b / sum
		}
		return shares
	}

	// Replicas are picked by measured latency, which a loaded machine
	// (the whole suite runs at once) skews for a while: read on until
	// every replica served a part, for at most 48 passes.
	sent := make([]float64, len(members))
	var shares []float64
	for passes := 0; passes < 48; passes += 4 {
		for j, b := range readPasses(4) {
			sent[j] += b
		}
		shares = shareOf(sent)
		if slices.Min(shares) >= 0.05 {
			break
		}
	}
	t.Logf("share of read bytes per replica (servers %v): %.2f", members, shares)
	for j, s := range shares {
		if s < 0.05 {
			t.Errorf("replica on server %d served %.0f%% of the reads; want them spread (>= 5%% each)", members[j], 100*s)
		}
	}

	slow := members[0]
	tc.proxies[slow].delay.Store(int64(20 * time.Millisecond))
	readPasses(1) // let the client measure
	shares = shareOf(readPasses(4))
	t.Logf("with server %d slowed down: share of read bytes per replica (servers %v): %.2f", slow, members, shares)
	if shares[0] > 0.1 {
		t.Errorf("the slow replica still served %.0f%% of the reads", 100*shares[0])
	}
	// The two near ones share the reads; how evenly depends on how
	// the machine's load skews their latencies.
	for j, s := range shares[1:] {
		if s < 0.15 {
			t.Errorf("near replica on server %d served only %.0f%% of the reads", members[j+1], 100*s)
		}
	}
}

// TestOnUnavailable checks the two modes for a chain whose only replica is
// down: fail gives EIO after the timeout; wait blocks until the server is
// back (and then reads the data) or until the caller gives up.
func TestOnUnavailable(t *testing.T) {
	const timeout = time.Second
	tests := []struct {
		name      string
		mode      string
		restartIn time.Duration // 0: not restarted
		ctxLimit  time.Duration // 0: none
		wantErr   error
		minTime   time.Duration
	}{
		{name: "fail", mode: OnUnavailableFail, wantErr: syscall.EIO, minTime: timeout},
		{name: "wait until back", mode: OnUnavailableWait, restartIn: 3 * timeout, minTime: 3 * timeout},
		{name: "wait interrupted", mode: OnUnavailableWait, ctxLimit: 2 * timeout, wantErr: context.DeadlineExceeded, minTime: 2 * timeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
			w := newTestClient(t, tc.metaAddr, Config{})
			ctx := context.Background()
			f := create(t, w, "f", syscall.O_WRONLY)
			want := bytes.Repeat([]byte("x"), 100<<10)
			if _, err := f.WriteAt(ctx, want, 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := newTestClient(t, tc.metaAddr, Config{OnUnavailable: tt.mode, UnavailableTimeout: timeout})
			g, _ := open(t, r, "f", syscall.O_RDONLY)
			defer g.Release(ctx)
			tc.stopData(0)
			var restarted chan struct{}
			if tt.restartIn > 0 {
				restarted = make(chan struct{})
				go func() {
					time.Sleep(tt.restartIn)
					tc.startData(0)
					close(restarted)
				}()
			}
			rctx := ctx
			if tt.ctxLimit > 0 {
				var cancel context.CancelFunc
				rctx, cancel = context.WithTimeout(ctx, tt.ctxLimit)
				defer cancel()
			}
			buf := make([]byte, len(want))
			start := time.Now()
			n, err := g.ReadAt(rctx, buf, 0)
			took := time.Since(start)
			t.Logf("read returned after %v: %d bytes, err %v", took, n, err)
			if restarted != nil {
				<-restarted
			}
			switch {
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("read: %v, want %v", err, tt.wantErr)
			case tt.wantErr == nil && (err != nil || !bytes.Equal(buf[:n], want)):
				t.Fatalf("read after the server came back: %d bytes, err %v", n, err)
			}
			if took < tt.minTime {
				t.Errorf("read returned after %v, before %v", took, tt.minTime)
			}
			if took > tt.minTime+5*time.Second {
				t.Errorf("read returned after %v, long after %v", took, tt.minTime)
			}
		})
	}
}

// A file on chains made after the client fetched its chain table is
// written at once: the client fetches the new chains instead of failing.
func TestWriteOnChainsNewerThanTheTable(t *testing.T) {
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 2, Replicas: 1}, 3)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	if _, err := c.Meta().SetLayout(ctx, &weftv1.SetLayoutRequest{Ino: 1, Layout: &weftv1.Layout{Replicas: 2}}); err != nil {
		t.Fatalf("set replicas 2 on the root: %v", err)
	}
	f := create(t, c, "f", syscall.O_WRONLY)
	if f.in.layout.GetReplicas() != 2 {
		t.Fatalf("new file's layout %v, want replicas 2", f.in.layout)
	}
	want := randomBytes(rand.New(rand.NewPCG(5, 6)), 200<<10)
	if _, err := f.WriteAt(ctx, want, 0); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	g, _ := open(t, c, "f", syscall.O_RDONLY)
	defer g.Release(ctx)
	got := make([]byte, len(want))
	if n, err := g.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got[:n], want) {
		t.Fatalf("read back %d bytes, err %v; equal %v", n, err, bytes.Equal(got[:n], want))
	}
}
