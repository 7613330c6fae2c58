package client

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

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
		Testing: Testing{CreateSendDelay: time.Minute}})
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
