// Package mount serves a weft file system through FUSE (go-fuse's raw
// API). It is a thin adapter: each FUSE operation checks its input, calls
// one method of package client and translates the error to an errno in one
// place (status). Kernel node ids are weft inode numbers (root 1). See
// README.md for the consistency and caching decisions.
package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// DefaultTimeout is the default attribute and entry cache timeout
// without callbacks.
const DefaultTimeout = time.Second

// DefaultCallbackTimeout is the default attribute and entry cache timeout
// with callbacks: the meta service tells the mount when something cached
// changes, so the timeout only bounds how long a change can go unseen in
// the rare windows callbacks cannot cover (see README.md "Callbacks").
const DefaultCallbackTimeout = time.Minute

// ShortTimeout is the attribute and entry timeout used with callbacks on
// while the callback stream is down (or not yet synchronized).
const ShortTimeout = time.Second

// maxWrite is the largest FUSE read or write request: 1 MiB measured about
// 1.7 times faster than go-fuse's default of 128 KiB.
const maxWrite = 1 << 20

// Options configures a mount.
type Options struct {
	// AllowOther lets every user of the machine use the mount (needs root
	// or user_allow_other in /etc/fuse.conf); permissions are still
	// enforced by the meta service.
	AllowOther bool
	// AttrTimeout and EntryTimeout are how long the kernel caches
	// attributes and directory entries; default DefaultCallbackTimeout
	// (1 min), or DefaultTimeout (1 s) with NoCallbacks.
	AttrTimeout, EntryTimeout time.Duration
	// NoCallbacks turns the meta service's callbacks off. With callbacks
	// (the default) the mount subscribes to them: changes made by other
	// clients invalidate the kernel's caches at once (FUSE notify), so
	// the timeouts can be long and missing names are cached too; while
	// the callback stream is down, ShortTimeout is used instead. Without,
	// only the timeouts and close-to-open bound staleness.
	NoCallbacks bool
	// callbacks is !NoCallbacks.
	callbacks bool
	// Debug logs every FUSE request and reply.
	Debug bool
	// FsName is shown in /proc/mounts and df; default "weft".
	FsName string
	// KernelReadAhead is the kernel's read-ahead window of the mount
	// (SetKernelReadAhead; needs root); 0: DefaultKernelReadAhead,
	// negative: the kernel's own 128 KiB.
	KernelReadAhead int64
}

// FS is a mounted weft file system.
type FS struct {
	srv        *fuse.Server
	fs         *weftFS
	c          *client.Client
	mountpoint string
	done       chan struct{}
	closeErr   error
}

// Mount mounts the file system of c at mountpoint and serves it in the
// background. As root it mounts directly (no fusermount3 needed); as
// another user it uses fusermount3. The Mount owns c from now on: when the
// file system is unmounted, c is flushed and closed.
func Mount(c *client.Client, mountpoint string, opts Options) (*FS, error) {
	opts.callbacks = !opts.NoCallbacks
	def := DefaultCallbackTimeout
	if !opts.callbacks {
		def = DefaultTimeout
	}
	if opts.AttrTimeout <= 0 {
		opts.AttrTimeout = def
	}
	if opts.EntryTimeout <= 0 {
		opts.EntryTimeout = def
	}
	if opts.FsName == "" {
		opts.FsName = "weft"
	}
	mp, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, fmt.Errorf("mount point %s: %w", mountpoint, err)
	}
	if err := checkMountpoint(mp); err != nil {
		return nil, err
	}
	fs := newFS(c, opts)
	fs.notes = newNotifier(fs)
	mo := &fuse.MountOptions{
		AllowOther:    opts.AllowOther,
		MaxWrite:      maxWrite,
		MaxBackground: 64,
		MaxReadAhead:  4 << 20, // a ceiling: the kernel offers FUSE 128 KiB and this cannot raise it (SetKernelReadAhead does)
		DisableSplice: true,    // replies are bytes: splicing them costs 3 syscalls per read for nothing
		// The kernel would otherwise ask for a file's attributes before
		// every read that follows a write, to see whether its cached
		// pages are still good; callbacks, close-to-open and remember
		// (fs.go) drop them instead.
		ExplicitDataCacheControl: true,
		FsName:                   opts.FsName,
		Name:                     "weft",
		Debug:                    opts.Debug,
		DirectMount:              os.Geteuid() == 0,
		DisabledCapabilities:     fuse.CAP_PASSTHROUGH,
		// flock and POSIX locks go to the meta service (locks.go), so
		// they hold across mounts.
		EnableLocks: true,
		// The kernel checks permissions too (against the cached
		// attributes, with the caller's real groups): without it a cached
		// dentry would let a path walk skip the search permission the
		// meta service checks at lookup.
		Options: []string{"default_permissions"},
		// Clearing setuid/setgid on write, truncate and chown is the meta
		// service's job; otherwise the kernel would send a chmod as the
		// writer, which a non-owner may not do.
		ExtraCapabilities: fuse.CAP_HANDLE_KILLPRIV_V2,
	}
	srv, err := fuse.NewServer(fs, mp, mo)
	if err != nil {
		hint := ""
		if os.Geteuid() != 0 {
			hint = " (as a normal user this needs fusermount3 from the fuse3 package, and user_allow_other in /etc/fuse.conf for allow_other)"
		}
		return nil, fmt.Errorf("mount weft at %s%s: %w", mp, hint, err)
	}
	m := &FS{srv: srv, fs: fs, c: c, mountpoint: mp, done: make(chan struct{})}
	go func() {
		srv.Serve()
		m.closeErr = c.Close()
		close(m.done)
	}()
	if err := srv.WaitMount(); err != nil {
		_ = srv.Unmount()
		<-m.done
		return nil, fmt.Errorf("mount weft at %s: %w", mp, err)
	}
	if ra := opts.KernelReadAhead; ra >= 0 {
		if ra == 0 {
			ra = DefaultKernelReadAhead
		}
		if err := SetKernelReadAhead(mp, uint64(ra)); err != nil {
			fs.log.Info("the kernel's read-ahead stays at its default, so sequential reads come in 128 KiB requests", "err", err)
		}
	}
	// The notifier also drops the pages of files found changed without
	// callbacks (fs.remember), and of files whose write-back failed: the
	// kernel must not answer reads of bytes that were never stored.
	go fs.notes.run(m.done)
	c.OnLostWrites(func(ino uint64) { fs.notes.deliver(&weftv1.Invalidation{Inodes: []uint64{ino}}) })
	if opts.callbacks {
		c.WatchCallbacks(fs.notes.deliver)
	}
	return m, nil
}

// checkMountpoint says clearly what is wrong with a mount point.
func checkMountpoint(mp string) error {
	st, err := os.Stat(mp)
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return fmt.Errorf("mount point %s is a stale FUSE mount whose server is gone (transport endpoint is not connected); "+
			"unmount it with `fusermount3 -u %s` (or `umount -l %s` as root) and try again", mp, mp, mp)
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("mount point %s does not exist; create it with `mkdir -p %s`", mp, mp)
	case err != nil:
		return fmt.Errorf("mount point %s: %w", mp, err)
	case !st.IsDir():
		return fmt.Errorf("mount point %s is not a directory", mp)
	}
	return nil
}

// Mountpoint returns the absolute path the file system is mounted at.
func (m *FS) Mountpoint() string { return m.mountpoint }

// Unmount flushes every buffered write, unmounts the file system, and
// closes the client (and its session). A busy mount point (a process with
// its current directory or an open file there) fails with EBUSY and stays
// mounted.
func (m *FS) Unmount() error {
	select {
	case <-m.done:
		return m.closeErr
	default:
	}
	flushErr := m.c.FlushAll(context.Background())
	if err := m.srv.Unmount(); err != nil {
		return fmt.Errorf("unmount %s: %w", m.mountpoint, err)
	}
	<-m.done
	return errors.Join(flushErr, m.closeErr)
}

// Wait blocks until the file system is unmounted (by Unmount or from
// outside, e.g. `fusermount3 -u`) and the client is closed.
func (m *FS) Wait() {
	<-m.done
}
