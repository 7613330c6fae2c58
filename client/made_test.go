package client

import (
	"context"
	"errors"
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
	return delegatedDirIn(t, c, 1, name)
}

// delegatedDirIn is delegatedDirOf in directory parent.
func delegatedDirIn(t *testing.T, c *Client, parent uint64, name string) uint64 {
	t.Helper()
	ctx := context.Background()
	root := sessionCaller(c)
	d, err := c.Mkdir(ctx, root, parent, name, 0o755)
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

// TestMadeFilePermissions checks that a create answered here decides as
// the meta service would: a caller who may not write in the delegated
// directory is refused at once (the meta service answers), and a file
// made in a setgid directory takes the directory's group, here and at
// the meta service.
func TestMadeFilePermissions(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}
	tc := startCluster(t, layout, 1)
	ctx := context.Background()
	c := newTestClient(t, tc.metaAddr, Config{OnInvalidate: func(*weftv1.Invalidation) {},
		Testing: Testing{CreateSendDelay: time.Minute}})
	other := newTestClient(t, tc.metaAddr, Config{})
	root := sessionCaller(c)
	plain := delegatedDirOf(t, c, "plain")
	const gid = 4242
	outer, err := c.Mkdir(ctx, root, 1, "setgid", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: root, Ino: outer.Ino,
		Valid: uint32(weftv1.SetAttrValid_SETATTR_MODE | weftv1.SetAttrValid_SETATTR_GID),
		Mode:  syscall.S_IFDIR | syscall.S_ISGID | 0o755, Gid: gid}); err != nil {
		t.Fatal(err)
	}
	setgid := delegatedDirIn(t, c, outer.Ino, "inner") // inherits the group and the setgid bit
	for _, tt := range []struct {
		name    string
		caller  *weftv1.Caller
		dir     uint64
		wantGid uint32
		wantErr syscall.Errno
	}{
		{name: "root", caller: root, dir: plain},
		{name: "no write permission", caller: &weftv1.Caller{Uid: 1000, Gid: 1000, Session: c.Session()}, dir: plain, wantErr: syscall.EACCES},
		{name: "setgid directory", caller: root, dir: setgid, wantGid: gid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := "f-" + tt.name
			_, made := c.Delegations()
			f, a, err := c.Create(ctx, tt.caller, tt.dir, name, 0o644, syscall.O_WRONLY, true)
			if tt.wantErr != 0 {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("create: %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Release(ctx)
			if _, now := c.Delegations(); now == made {
				t.Fatal("the file was not made under the delegation")
			}
			if a.Gid != tt.wantGid {
				t.Errorf("made here with gid %d, want %d", a.Gid, tt.wantGid)
			}
			if err := c.SyncDir(ctx, tt.dir); err != nil {
				t.Fatal(err)
			}
			stored, err := other.Lookup(ctx, root, tt.dir, name)
			if err != nil {
				t.Fatal(err)
			}
			if stored.Gid != a.Gid || stored.Uid != a.Uid || stored.Mode != a.Mode {
				t.Errorf("made here as uid %d gid %d mode %#o, stored as %d %d %#o", a.Uid, a.Gid, a.Mode, stored.Uid, stored.Gid, stored.Mode)
			}
		})
	}
}
