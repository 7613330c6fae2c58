package meta

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/data"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// fsckEnv is a served meta service with two real data servers (one
// target each), files with replicas 2 (so every chain has both targets)
// and a client session.
type fsckEnv struct {
	t       *testing.T
	ctx     context.Context
	s       *Service
	targets []string // the data servers' target directories
	session string
}

func newFsckEnv(t *testing.T) *fsckEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Open(ctx, Config{
		Dir:           t.TempDir(),
		DefaultLayout: &weftv1.Layout{Replicas: 2, StripeCount: 2, ChunkSize: 64 << 10},
		Cluster:       cluster.Config{Logger: quietLogger(), HeartbeatInterval: 100 * time.Millisecond, FailureTimeout: 3 * time.Second},
		Logger:        quietLogger(),
		SessionLease:  time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { s.Serve(ctx, lis); close(served) }()
	e := &fsckEnv{t: t, ctx: context.Background(), s: s}
	var stopped []chan struct{}
	for i := range 2 {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("data%d", i))
		d, err := data.Open(data.Config{Dir: dir, MetaAddr: lis.Addr().String(), ScrubRate: -1, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		dl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		stopped = append(stopped, done)
		go func() { d.Serve(ctx, dl); close(done) }()
		e.targets = append(e.targets, dir)
	}
	t.Cleanup(func() {
		cancel()
		for _, d := range stopped {
			<-d
		}
		<-served
	})
	e.waitChains()
	sess, err := s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "test", MountPoint: "/mnt"})
	if err != nil {
		t.Fatal(err)
	}
	e.session = sess.Session
	return e
}

// waitChains waits for chains of two serving members that both data
// servers know (a write through each succeeds).
func (e *fsckEnv) waitChains() {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tab, err := e.s.GetChains(e.ctx, &weftv1.GetChainsRequest{})
		wide := 0
		ready := err == nil
		for _, c := range tab.GetChains() {
			serving := 0
			for _, m := range c.Members {
				if m.State == "serving" || m.State == "" {
					serving++
				}
			}
			if c.Replicas == 2 {
				wide++
				ready = ready && serving == 2
			}
		}
		if ready && wide >= 2 {
			// The data servers learn the table from their heartbeats.
			probe := &weftv1.Attr{Ino: 1 << 40, Mode: syscall.S_IFREG, Layout: &weftv1.Layout{ChunkSize: 64 << 10}}
			ok := true
			for _, c := range tab.Chains {
				probe.Layout.Chains = []uint64{c.Id}
				ok = ok && e.tryWrite(probe, 0, []byte("x")) == nil
			}
			if ok {
				// Leave no trace of the probes.
				for _, c := range tab.Chains {
					if err := e.s.cluster.DeleteFile(e.ctx, 1<<40, &weftv1.Layout{Chains: []uint64{c.Id}}); err != nil {
						e.t.Fatal(err)
					}
				}
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no chains of two serving members after 30s: %v %v", tab, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chain returns chain id from the chain table.
func (e *fsckEnv) chain(id uint64) *weftv1.Chain {
	e.t.Helper()
	tab, err := e.s.GetChains(e.ctx, &weftv1.GetChainsRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range tab.Chains {
		if c.Id == id {
			return c
		}
	}
	e.t.Fatalf("no chain %d", id)
	return nil
}

func (e *fsckEnv) dataClient(addr string) weftv1.DataClient {
	e.t.Helper()
	cc, err := rpc.Dial(addr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cc.Close() })
	return weftv1.NewDataClient(cc)
}

// chunkClient is a client of the chunk I/O (the lean protocol, on the
// server's port) of the data server at addr.
func (e *fsckEnv) chunkClient(addr string) *wire.Client {
	c := wire.NewClient(addr, 0)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// tryWrite writes data at the start of chunk index of file a through the
// head of its chain.
func (e *fsckEnv) tryWrite(a *weftv1.Attr, index uint64, b []byte) error {
	id := a.Layout.Chains[index%uint64(len(a.Layout.Chains))]
	tab, err := e.s.GetChains(e.ctx, &weftv1.GetChainsRequest{})
	if err != nil {
		return err
	}
	var c *weftv1.Chain
	for _, ch := range tab.Chains {
		if ch.Id == id {
			c = ch
		}
	}
	if c == nil {
		return fmt.Errorf("no chain %d", id)
	}
	_, err = e.chunkClient(c.Members[0].Address).WriteChunk(e.ctx, &weftv1.WriteChunkRequest{
		Chunk: &weftv1.ChunkID{Ino: a.Ino, Index: index}, ChainId: id, ChainVersion: c.Version,
		Data: b, ChunkSize: a.Layout.ChunkSize,
	})
	return err
}

func (e *fsckEnv) write(a *weftv1.Attr, index uint64, b []byte) {
	e.t.Helper()
	if err := e.tryWrite(a, index, b); err != nil {
		e.t.Fatalf("write chunk %d of inode %d: %v", index, a.Ino, err)
	}
}

// writeTail writes a new chunk on the chain's last member only, as a
// forwarded write, so the other member lacks it.
func (e *fsckEnv) writeTail(a *weftv1.Attr, index uint64, b []byte) {
	e.t.Helper()
	id := a.Layout.Chains[index%uint64(len(a.Layout.Chains))]
	c := e.chain(id)
	tail := c.Members[len(c.Members)-1]
	_, err := e.chunkClient(tail.Address).WriteChunk(e.ctx, &weftv1.WriteChunkRequest{
		Chunk: &weftv1.ChunkID{Ino: a.Ino, Index: index}, ChainId: id, ChainVersion: c.Version,
		Data: b, ChunkSize: a.Layout.ChunkSize, Forwarded: true, ChunkVersion: 1, TargetId: tail.TargetId,
	})
	if err != nil {
		e.t.Fatalf("write chunk %d of inode %d on the tail: %v", index, a.Ino, err)
	}
}

// chunkCopies counts the targets holding chunk index of inode ino.
func (e *fsckEnv) chunkCopies(ino, index uint64) int {
	n := 0
	for _, dir := range e.targets {
		p := filepath.Join(dir, "chunks", fmt.Sprintf("%02x", ino%256), fmt.Sprintf("%x", ino), fmt.Sprint(index)+".w")
		if _, err := os.Stat(p); err == nil {
			n++
		}
	}
	return n
}

// file creates and writes a file of size bytes (open in the session while
// open is set).
func (e *fsckEnv) file(parent uint64, name string, size int, open bool) *weftv1.Attr {
	e.t.Helper()
	a, err := e.fileErr(parent, name, size, open)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// fileErr is file for other goroutines than the test's: it returns errors.
// Writes refused while a data server catches up with the chain table are
// retried, as a client does.
func (e *fsckEnv) fileErr(parent uint64, name string, size int, open bool) (*weftv1.Attr, error) {
	req := &weftv1.CreateRequest{Caller: root, Parent: parent, Name: name, Mode: syscall.S_IFREG | 0o644, Exclusive: true}
	if open {
		req.Session = e.session
	}
	resp, err := e.s.Create(e.ctx, req)
	if err != nil {
		return nil, err
	}
	a := resp.Attr
	cs := int(a.Layout.ChunkSize)
	for i := 0; i*cs < size; i++ {
		b := []byte(strings.Repeat("d", min(cs, size-i*cs)))
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := e.tryWrite(a, uint64(i), b)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("write chunk %d of inode %d: %w", i, a.Ino, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if size > 0 {
		if _, err := e.s.CommitWrite(e.ctx, &weftv1.CommitWriteRequest{Caller: root, Ino: a.Ino, Size: uint64(size)}); err != nil {
			return nil, err
		}
	}
	r, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: a.Ino})
	if err != nil {
		return nil, err
	}
	return r.Attr, nil
}

func (e *fsckEnv) attr(ino uint64) *weftv1.Attr {
	e.t.Helper()
	r, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: ino})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Attr
}

func (e *fsckEnv) mkdir(parent uint64, name string) *weftv1.Attr {
	e.t.Helper()
	r, err := e.s.Mkdir(e.ctx, &weftv1.MkdirRequest{Caller: root, Parent: parent, Name: name, Mode: 0o755})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Attr
}

// kv changes the engine directly, under the running service.
func (e *fsckEnv) kv(fn func(t kv.Txn) error) {
	e.t.Helper()
	if err := e.s.eng.Update(e.ctx, fn); err != nil {
		e.t.Fatal(err)
	}
}

func (e *fsckEnv) fsck(repair bool) *weftv1.FsckResponse {
	e.t.Helper()
	r, err := e.s.Fsck(e.ctx, &weftv1.FsckRequest{Repair: repair})
	if err != nil {
		e.t.Fatalf("fsck (repair %v): %v", repair, err)
	}
	return r
}

// kinds lists the kinds of the problems, sorted, marking repaired ones
// with a "+".
func kinds(r *weftv1.FsckResponse) []string {
	var out []string
	for _, p := range r.Problems {
		k := p.Kind
		if p.Repaired {
			k += "+"
		}
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func describeProblems(r *weftv1.FsckResponse) string {
	var b strings.Builder
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "\n  %s ino=%d parent=%d name=%q repaired=%v: %s", p.Kind, p.Ino, p.Parent, p.Name, p.Repaired, p.Detail)
	}
	return b.String()
}
