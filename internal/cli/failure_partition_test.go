package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/faultproxy"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// ackWriter writes files one after the other until stopped and remembers
// those acknowledged (fsync and close returned success).
type ackWriter struct {
	dir   string
	size  int
	stall stallMeter

	mu    sync.Mutex
	acked []string
	errs  []error
	stop  chan struct{}
	done  chan struct{}
}

func startAckWriter(dir string, size int) *ackWriter {
	w := &ackWriter{dir: dir, size: size, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *ackWriter) run() {
	defer close(w.done)
	for i := 0; ; i++ {
		select {
		case <-w.stop:
			return
		default:
		}
		name := fmt.Sprintf("ack-%04d", i)
		content := pattern(name, w.size)
		start := time.Now()
		err := func() error {
			f, err := os.Create(filepath.Join(w.dir, name))
			if err != nil {
				return err
			}
			defer f.Close()
			for off := 0; off < len(content); off += 512 << 10 {
				t0 := time.Now()
				if _, err := f.Write(content[off:min(off+512<<10, len(content))]); err != nil {
					return err
				}
				w.stall.record(time.Since(t0), fmt.Sprintf("write of %s at %d", name, off))
			}
			t0 := time.Now()
			if err := f.Sync(); err != nil {
				return err
			}
			w.stall.record(time.Since(t0), "fsync of "+name)
			return f.Close()
		}()
		w.mu.Lock()
		if err != nil {
			w.errs = append(w.errs, fmt.Errorf("%s (started %s): %w", name, start.Format("15:04:05.000"), err))
		} else {
			w.acked = append(w.acked, name)
		}
		w.mu.Unlock()
		time.Sleep(100 * time.Millisecond) // a steady stream, not a flood
	}
}

// finish stops the writer and waits for the file in progress.
func (w *ackWriter) finish(t *testing.T) {
	t.Helper()
	close(w.stop)
	select {
	case <-w.done:
	case <-time.After(time.Minute):
		t.Fatal("the writer is stuck for a minute")
	}
}

func (w *ackWriter) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// TestPartitionDataServerIsolated cuts a data server off from everything
// (clients and peers reach it through one proxy, it reaches the meta
// service through another) while a client writes. Writes go on on the
// others after the failure timeout; the isolated server fences itself and
// serves nothing; after the network is restored it resyncs, and every
// acknowledged write reads back correctly, also while it syncs.
func TestPartitionDataServerIsolated(t *testing.T) {
	const partitionFor = 6 * time.Second
	c := newFailCluster(t, 2, []string{"--replicas", "2"}, nil)

	// The third data server: inbound through in, outbound to meta through out.
	listen := freePort(t)
	in, err := faultproxy.New(listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	// The proxy in front of the third data server is gone when the fsck
	// at the end runs: its chains cannot be checked.
	c.leavesDamage("chain_not_checked")
	out, err := faultproxy.New(c.metaAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	iso := &dataNode{n: 3, dir: filepath.Join(c.base, "data3"), listen: listen, advertise: in.Addr(), metaAddr: out.Addr()}
	c.data = append(c.data, iso)
	c.startData(iso)
	if err := waitOnline(c.metaAddr, 3, failWait); err != nil {
		t.Fatal(err)
	}
	c.waitFor("chains on the third data server", failWait, func() bool {
		st, err := c.status()
		return err == nil && len(st.GetChainList()) >= 6 // 3 of width 1, 3 of width 2
	})
	c.waitHealthy(2, failWait)
	isoTarget := c.targetOf(iso)

	mnt := c.mount()
	dir := filepath.Join(mnt, "acked")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const size = 3<<20 + 12345
	w := startAckWriter(dir, size)
	t.Cleanup(func() {
		select {
		case <-w.stop:
		default:
			close(w.stop)
			select {
			case <-w.done:
			case <-time.After(30 * time.Second): // stuck on the mount: its cleanup aborts it
			}
		}
	})
	c.waitFor("the first acknowledged files", 30*time.Second, func() bool { return w.ackedCount() >= 3 })

	tab, err := c.mc.GetChains(context.Background(), &weftv1.GetChainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	ackedBefore := w.ackedCount()
	in.Cut()
	out.Cut()
	t.Logf("data server 3 (target %d) cut off after %d acknowledged files", isoTarget, ackedBefore)
	if err := waitServers(c.metaAddr, func(online int) bool { return online == 2 }, failWait); err != nil {
		t.Fatal(err)
	}
	t.Logf("meta service saw it offline after %v", time.Since(cutAt).Round(time.Millisecond))
	c.waitFor("writes acknowledged during the partition", 30*time.Second, func() bool { return w.ackedCount() >= ackedBefore+3 })

	// The isolated server, asked directly (not through the proxy) with the
	// chain versions it knows, must refuse to serve: it is fenced.
	probeFenced(t, listen, tab, isoTarget)

	// A mount made during the partition reads while the server rejoins.
	mid := c.mount()
	// A partition of several seconds: long enough for connection retries
	// to back off.
	time.Sleep(time.Until(cutAt.Add(partitionFor)))
	in.Restore()
	out.Restore()
	restored := time.Now()
	duringCut := w.ackedCount() - ackedBefore
	rejoined := make(chan time.Duration, 1)
	go func() {
		if waitOnline(c.metaAddr, 3, failWait) == nil {
			rejoined <- time.Since(restored)
		}
		close(rejoined)
	}()
	before := dirBytes(iso.dir)
	checked := 0
	for {
		_, healthy := func() (string, bool) {
			st, err := c.status()
			if err != nil {
				return "", false
			}
			return chainHealth(st, 2)
		}()
		w.mu.Lock()
		acked := append([]string(nil), w.acked...)
		w.mu.Unlock()
		// Every acknowledged file reads back correctly while data server 3
		// resyncs (it must not serve what it missed).
		for _, name := range acked[checked:] {
			got, err := os.ReadFile(filepath.Join(mid, "acked", name))
			if err != nil || !bytes.Equal(got, pattern(name, size)) {
				t.Errorf("acknowledged %s while data server 3 rejoins: err %v, %d bytes, correct %v", name, err, len(got), bytes.Equal(got, pattern(name, size)))
			}
		}
		checked = len(acked)
		if healthy {
			break
		}
		if time.Since(restored) > failWait {
			st, _ := c.status()
			desc, _ := chainHealth(st, 2)
			t.Fatalf("chains not healthy %v after the network came back: %s", failWait, desc)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resync := time.Since(restored)
	if d, ok := <-rejoined; ok {
		t.Logf("data server 3 back online %v after a %v partition ended", d.Round(time.Millisecond), partitionFor)
		if d > 3500*time.Millisecond {
			t.Errorf("data server 3 took %v to reach the meta service again after the network came back", d)
		}
	}
	copied := dirBytes(iso.dir) - before
	w.finish(t)
	maxStall, where := w.stall.get()
	t.Logf("partition: %d files acknowledged during it; longest stall %v (%s); resync after restore took %v, target grew %d KiB (%.1f MiB/s)",
		duringCut, maxStall.Round(time.Millisecond), where, resync.Round(time.Millisecond), copied>>10, float64(copied)/(1<<20)/resync.Seconds())
	for _, err := range w.errs {
		t.Errorf("writer error: %v", err)
	}
	if maxStall > failTimeout+5*time.Second {
		t.Errorf("the application stalled %v (%s)", maxStall, where)
	}

	// No acknowledged write lost: all read back through a fresh mount.
	fresh := c.mount()
	for _, name := range w.acked {
		got, err := os.ReadFile(filepath.Join(fresh, "acked", name))
		if err != nil || !bytes.Equal(got, pattern(name, size)) {
			t.Errorf("acknowledged %s through a fresh mount: err %v, %d bytes, correct %v", name, err, len(got), bytes.Equal(got, pattern(name, size)))
		}
	}
	t.Logf("%d acknowledged files read back; %d chunks identical on both replicas", len(w.acked), c.checkReplicasIdentical(2))
}

// probeFenced reads from the server at addr, for every replicated chain
// with target in tab, at the chain version of tab: every read must fail.
func probeFenced(t *testing.T, addr string, tab *weftv1.ChainTable, target uint64) {
	t.Helper()
	dc := wire.NewClient(addr, 0) // chunk I/O: the lean protocol on the server's port
	defer dc.Close()
	probes := 0
	for _, ch := range tab.GetChains() {
		if len(ch.GetMembers()) < 2 {
			continue
		}
		for _, m := range ch.GetMembers() {
			if m.GetTargetId() != target {
				continue
			}
			for ino := uint64(2); ino < 12; ino++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := dc.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: ino, Index: 0},
					ChainId: ch.GetId(), ChainVersion: ch.GetVersion(), Length: 4096})
				cancel()
				probes++
				if err == nil {
					t.Errorf("isolated data server served chunk (%d, 0) of chain %d (%d bytes): it must fence itself", ino, ch.GetId(), len(resp.GetData()))
				} else if probes == 1 {
					t.Logf("isolated data server refuses reads: %v", status.Convert(err).Message())
				}
			}
		}
	}
	if probes == 0 {
		t.Errorf("no replicated chain with target %d in the table", target)
	}
}
