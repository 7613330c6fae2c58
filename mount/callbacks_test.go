package mount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// mountWith mounts the cluster with a client of its own and opts, and
// waits until its callback stream is live (with callbacks on).
func mountWith(t *testing.T, tc *testCluster, opts Options) (string, *client.Client, *FS) {
	t.Helper()
	return mountWithConfig(t, tc, opts, client.Config{})
}

// mountWithConfig is mountWith with the client configured by cfg (its
// meta address, mount point and logger are set here).
func mountWithConfig(t *testing.T, tc *testCluster, opts Options, cfg client.Config) (string, *client.Client, *FS) {
	t.Helper()
	cfg.MetaAddr, cfg.MountPoint = tc.metaAddr, "test"
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := client.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := Mount(c, dir, opts)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var err error
		for range 50 {
			if err = m.Unmount(); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("unmount %s: %v", dir, err)
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	})
	if !opts.NoCallbacks {
		eventually(t, "callback stream live", func() error {
			if !c.CallbacksLive() {
				return errors.New("not live")
			}
			return nil
		})
	}
	return dir, c, m
}

// eventually polls cond until it returns nil, failing the test after a
// few seconds: far below the mount's attribute and entry timeouts, so
// only a callback can make it pass.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after 5s", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCallbacksAcrossMounts changes things on mount A and checks that
// mount B, which cached them with timeouts of 10 minutes, sees each change
// within seconds: only a callback can explain it.
func TestCallbacksAcrossMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE: %v", err)
	}
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 2, Replicas: 1}, 2)
	long := Options{AttrTimeout: 10 * time.Minute, EntryTimeout: 10 * time.Minute}
	a, _, _ := mountWith(t, tc, long)
	b, cb, mb := mountWith(t, tc, long)
	pa := func(n string) string { return filepath.Join(a, n) }
	pb := func(n string) string { return filepath.Join(b, n) }
	stat := func(p string) (os.FileInfo, error) { return os.Stat(p) }

	// B caches "f" as missing (a negative entry).
	if _, err := stat(pb("f")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat f on B before it exists: %v", err)
	}
	t.Run("create", func(t *testing.T) {
		if err := os.WriteFile(pa("f"), []byte("12345"), 0o644); err != nil {
			t.Fatal(err)
		}
		eventually(t, "f created on A seen on B", func() error {
			_, err := stat(pb("f"))
			return err
		})
	})
	t.Run("chmod", func(t *testing.T) {
		if st, err := stat(pb("f")); err != nil || st.Mode().Perm() != 0o644 {
			t.Fatalf("B: %v %v", st, err)
		}
		if err := os.Chmod(pa("f"), 0o600); err != nil {
			t.Fatal(err)
		}
		eventually(t, "chmod on A seen on B", func() error {
			st, err := stat(pb("f"))
			if err == nil && st.Mode().Perm() != 0o600 {
				err = errors.New("mode " + st.Mode().String())
			}
			return err
		})
	})
	t.Run("write size", func(t *testing.T) {
		if st, err := stat(pb("f")); err != nil || st.Size() != 5 {
			t.Fatalf("B: %v %v", st, err)
		}
		f, err := os.OpenFile(pa("f"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "write on A seen on B", func() error {
			st, err := stat(pb("f"))
			if err == nil && st.Size() != 1005 {
				err = errors.New("size " + st.Name())
			}
			return err
		})
		// Close-to-open: the data too.
		got, err := os.ReadFile(pb("f"))
		if err != nil || len(got) != 1005 || string(got[:5]) != "12345" {
			t.Errorf("B reads %d bytes, %v", len(got), err)
		}
	})
	t.Run("rename", func(t *testing.T) {
		if _, err := stat(pb("g")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat g on B: %v", err)
		}
		if err := os.Rename(pa("f"), pa("g")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "rename on A seen on B", func() error {
			if _, err := stat(pb("f")); !errors.Is(err, os.ErrNotExist) {
				return errors.New("old name still there")
			}
			_, err := stat(pb("g"))
			return err
		})
	})
	t.Run("mkdir and list", func(t *testing.T) {
		if err := os.Mkdir(pa("d"), 0o755); err != nil {
			t.Fatal(err)
		}
		eventually(t, "mkdir on A listed on B", func() error {
			ents, err := os.ReadDir(b)
			if err == nil && len(ents) != 2 {
				err = errors.New("listing lacks d")
			}
			return err
		})
	})
	t.Run("unlink", func(t *testing.T) {
		if _, err := stat(pb("g")); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(pa("g")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "unlink on A seen on B", func() error {
			if _, err := stat(pb("g")); !errors.Is(err, os.ErrNotExist) {
				return errors.New("still there")
			}
			return nil
		})
	})
	if ino, ent, _ := mb.NotifyCounts(); ino == 0 || ent == 0 {
		t.Errorf("B sent %d inode and %d entry notifications", ino, ent)
	}

	// Cached metadata reads send nothing to the meta service.
	t.Run("cached stat makes no call", func(t *testing.T) {
		if err := os.WriteFile(pa("h"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		eventually(t, "h on B", func() error { _, err := stat(pb("h")); return err })
		// Callbacks of A's create and close may still arrive and make B
		// look h up again; wait until a round of stats is served from the
		// cache, then count.
		eventually(t, "B's cache of h to settle", func() error {
			before := cb.MetaCalls()
			for range 50 {
				stat(pb("h"))
				stat(pb("missing"))
			}
			if n := cb.MetaCalls() - before; n > 0 {
				time.Sleep(50 * time.Millisecond)
				return fmt.Errorf("%d meta calls", n)
			}
			return nil
		})
		before := cb.MetaCalls()
		for range 1000 {
			if _, err := stat(pb("h")); err != nil {
				t.Fatal(err)
			}
			if _, err := stat(pb("missing")); !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		// The negative entry of "missing" may have cost one lookup.
		if n := cb.MetaCalls() - before; n > 1 {
			t.Errorf("2000 cached stats made %d meta calls", n)
		}
	})
}

// TestOpenFileSeesOtherMountsWrite checks that a file held open on one
// mount shows another mount's rewrite of it (same length), though the
// kernel does not drop cached pages by itself when it sees a file's mtime
// change: with callbacks the callback drops them, without callbacks the
// next fetch of the file's attributes (here fstat, past the attribute
// timeout) does.
func TestOpenFileSeesOtherMountsWrite(t *testing.T) {
	needFUSE(t)
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 2, Replicas: 1}, 1)
	a, _, _ := mountWith(t, tc, Options{})
	tests := []struct {
		name string
		opts Options
	}{
		{"callbacks", Options{AttrTimeout: 10 * time.Minute, EntryTimeout: 10 * time.Minute}},
		{"no callbacks", Options{NoCallbacks: true}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _, _ := mountWith(t, tc, tt.opts)
			name := fmt.Sprint("shared", i)
			old := bytes.Repeat([]byte("1"), 100<<10)
			if err := os.WriteFile(filepath.Join(a, name), old, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(filepath.Join(b, name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got := make([]byte, len(old))
			if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
				t.Fatalf("first read on b: %v", err)
			}
			upd := bytes.Repeat([]byte("2"), len(old))
			time.Sleep(10 * time.Millisecond) // a later mtime
			if err := os.WriteFile(filepath.Join(a, name), upd, 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, "b's open file shows a's rewrite", func() error {
				if tt.opts.NoCallbacks {
					if _, err := f.Stat(); err != nil {
						return err
					}
				}
				if _, err := f.ReadAt(got, 0); err != nil {
					return err
				}
				if !bytes.Equal(got, upd) {
					return errors.New("old bytes")
				}
				return nil
			})
		})
	}
}

// TestReadAfterWriteAsksNothing checks that reads following writes on an
// open file make no metadata calls (the kernel would ask for the file's
// attributes before each such read if it invalidated its data cache by
// itself).
func TestReadAfterWriteAsksNothing(t *testing.T) {
	needFUSE(t)
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 2, Replicas: 1}, 1)
	dir, c, _ := mountWith(t, tc, Options{})
	f, err := os.OpenFile(filepath.Join(dir, "rw"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat(); err != nil {
		t.Fatal(err)
	}
	const n = 50
	calls := c.MetaCalls()
	buf := make([]byte, 4<<10)
	for i := range n {
		if _, err := f.WriteAt(buf, int64(i)*16<<10); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(buf, int64(i)*16<<10+8<<10); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.MetaCalls() - calls; got > n/10 {
		t.Errorf("%d metadata calls for %d writes each followed by a read, want (almost) none", got, n)
	}
}
