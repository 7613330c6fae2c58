package client

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/perm"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// delegatedDirOf makes directory name under the root with c and returns
// it once c makes files there under a delegation.
func delegatedDirOf(t *testing.T, c *Client, name string) uint64 {
	t.Helper()
	ctx := context.Background()
	root := sessionCaller(c)
	d, err := c.Mkdir(ctx, root, 1, name, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		_, made := c.Delegations()
		f, _, err := c.Create(ctx, root, d.Ino, fmt.Sprintf("warm-%d", i), 0o644, syscall.O_WRONLY, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, now := c.Delegations(); now > made {
			return d.Ino
		}
		if time.Now().After(deadline) {
			t.Fatal("no create delegation of a new directory after 10 s of creates in it")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sessionCaller is root as a mount of c calls: with c's session, which
// delegations need.
func sessionCaller(c *Client) *weftv1.Caller {
	return &weftv1.Caller{Uid: 0, Gid: 0, Session: c.Session()}
}

// crash stops c as a killed process would: no more renewals, flushes or
// confirmations; its connections drop.
func (c *Client) crash() {
	c.cancelBg()
	c.chains.close()
	_ = c.conn.close()
}

// TestInFlightCloseSettled checks closes that send a small file's data
// and its create at once. A file closed so reads back whole from another
// client. A file whose data never reaches its data server (stopped) while
// its create does, written by a client that then dies, is cut to length 0
// once the session ends and the server is back: it never stays a file of
// zeros with its length.
func TestInFlightCloseSettled(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}
	tc := startClusterOpts(t, layout, 1, clusterOpts{sessionLease: 1500 * time.Millisecond})
	ctx := context.Background()
	// Creates wait for their closes (the stopping of the data server takes
	// longer than the default 2 ms).
	w, err := New(ctx, Config{MetaAddr: tc.metaAddr, MountPoint: "test:writer", OnInvalidate: func(*weftv1.Invalidation) {}, CreateSendDelay: time.Minute,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	crashed := false
	t.Cleanup(func() {
		if !crashed {
			w.crash()
		}
	})
	r := newTestClient(t, tc.metaAddr, Config{})
	dir := delegatedDirOf(t, w, "d")
	wroot := sessionCaller(w)

	rng := rand.New(rand.NewPCG(7, 8))
	kept := randomBytes(rng, 64<<10)
	f, _, err := w.Create(ctx, wroot, dir, "kept", 0o644, syscall.O_WRONLY, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, kept, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// As GNU tar does: the times set on the open file after its write
	// (which puts the length into the create), then the close.
	tarred := randomBytes(rng, 10<<10)
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()
	f, _, err = w.Create(ctx, wroot, dir, "tarred", 0o644, syscall.O_WRONLY, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, tarred, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := w.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: wroot, Ino: f.Ino(), Valid: perm.SetAtime | perm.SetMtime, AtimeNs: mtime, MtimeNs: mtime}); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := w.InFlightCloses(); n != 2 {
		t.Fatalf("%d closes sent data and create at once, want 2", n)
	}
	readBack := func(name string) []byte {
		t.Helper()
		a, err := r.Lookup(ctx, root, dir, name)
		if err != nil {
			t.Fatal(err)
		}
		g, _, err := r.Open(ctx, root, a.Ino, syscall.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Release(ctx)
		return readAll(t, g, int(a.Size), 128<<10)
	}
	// (Read back at the end: a lookup from another client now would
	// recall the directory, and the next file would not be made here.)

	lost := randomBytes(rng, 48<<10)
	f, _, err = w.Create(ctx, wroot, dir, "lost", 0o644, syscall.O_WRONLY, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, lost, 0); err != nil {
		t.Fatal(err)
	}
	tc.stopData(0)
	f.in.mu.Lock()
	p := f.in.pending
	f.in.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	closed := make(chan error, 1)
	go func() { closed <- f.Release(cctx) }()
	// The close sends the create with the data in flight (looking the
	// file up from another client before would recall the directory,
	// which sends the create as it is).
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.deleg.mu.Lock()
		sent, inFlight := p.sent, p.nf.DataInFlight
		w.deleg.mu.Unlock()
		if sent {
			if !inFlight {
				t.Fatal("the create went without the data in flight")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the close did not send the create")
		}
		time.Sleep(time.Millisecond)
	}
	// The create arrives; the data cannot.
	for {
		a, err := r.Lookup(ctx, root, dir, "lost")
		if err == nil && a.Size == uint64(len(lost)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the create of the file whose data cannot be written did not arrive with its length: %v %v", a, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	w.crash()
	crashed = true
	<-closed
	tc.startData(0)
	deadline = time.Now().Add(20 * time.Second)
	for {
		a, err := r.Lookup(ctx, root, dir, "lost")
		if err != nil {
			t.Fatal(err)
		}
		if a.Size == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the file whose data never arrived still has length %d after its writer's session ended", a.Size)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := readBack("kept"); !bytes.Equal(got, kept) {
		t.Fatalf("the file closed with its data in flight reads %d bytes from another client after its writer died, want its %d", len(got), len(kept))
	}
	if got := readBack("tarred"); !bytes.Equal(got, tarred) {
		t.Fatalf("the file whose times were set before its close reads %d bytes, want its %d", len(got), len(tarred))
	}
	if a, err := r.Lookup(ctx, root, dir, "tarred"); err != nil || a.MtimeNs != mtime {
		t.Fatalf("the file whose times were set before its close: mtime %v, err %v; want %d", a.GetMtimeNs(), err, mtime)
	}
}

// TestNamesOfFilesNotSentYet checks unlink, rename, link, a lock and an
// extended attribute of files made under a delegation and not sent to the
// meta service yet (closed, empty: nothing made them go), and SyncDir:
// each finds the file (the meta service gets it first), and after SyncDir
// another client sees the name.
func TestNamesOfFilesNotSentYet(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}
	tc := startCluster(t, layout, 1)
	ctx := context.Background()
	c, err := New(ctx, Config{MetaAddr: tc.metaAddr, MountPoint: "test:names", OnInvalidate: func(*weftv1.Invalidation) {},
		CreateSendDelay: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other := newTestClient(t, tc.metaAddr, Config{})
	root := sessionCaller(c)
	dir := delegatedDirOf(t, c, "d")
	mk := func(name string) *weftv1.Attr {
		t.Helper()
		f, a, err := c.Create(ctx, root, dir, name, 0o644, syscall.O_WRONLY, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return a
	}
	mk("gone")
	if err := c.Unlink(ctx, root, dir, "gone"); err != nil {
		t.Fatalf("unlink of a file not sent yet: %v", err)
	}
	mk("moved")
	if err := c.Rename(ctx, root, dir, "moved", dir, "moved2", 0); err != nil {
		t.Fatalf("rename of a file not sent yet: %v", err)
	}
	a := mk("linked")
	if _, err := c.Link(ctx, root, a.Ino, dir, "linked2"); err != nil {
		t.Fatalf("link of a file not sent yet: %v", err)
	}
	locked := mk("locked")
	if _, err := c.SetLock(ctx, root, locked.Ino, 1, Lock{Type: LockWrite, Start: 0, End: 100}, false, false); err != nil {
		t.Fatalf("lock on a file not sent yet: %v", err)
	}
	tagged := mk("tagged")
	if err := c.SetXattr(ctx, root, tagged.Ino, "user.k", []byte("v"), 0); err != nil {
		t.Fatalf("extended attribute of a file not sent yet: %v", err)
	}
	mk("synced")
	if err := c.SyncDir(ctx, dir); err != nil {
		t.Fatalf("SyncDir: %v", err)
	}
	for _, name := range []string{"moved2", "linked", "linked2", "locked", "tagged", "synced"} {
		if _, err := other.Lookup(ctx, root, dir, name); err != nil {
			t.Errorf("another client: lookup of %s: %v", name, err)
		}
	}
	if _, err := other.Lookup(ctx, root, dir, "gone"); err == nil {
		t.Error("another client still sees the unlinked file")
	}
}
