package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// The write-back error tests break what a writer's data goes to (a data
// server killed, a target's disk turned read-only, failed or full) and
// check what the writer is told and what the file holds afterwards.

// waitLog polls the log of daemon name until it holds substr.
func (c *failCluster) waitLog(name, substr string) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%q in the log of %s", substr, name), failWait, func() bool {
		b, _ := os.ReadFile(filepath.Join(c.base, "logs", name+".log"))
		return bytes.Contains(b, []byte(substr))
	})
}

// wantErrno fails the test unless err carries errno e.
func wantErrno(t *testing.T, what string, err error, e syscall.Errno) {
	t.Helper()
	if !errors.Is(err, e) {
		t.Errorf("%s: %v, want %v", what, err, e)
	}
}

// TestFailureWriteBackErrorExact: one data server (replicas 1) is killed
// while a file it holds is written through a mount that fails I/O after
// 2 s (--on-unavailable=fail); the write-back of the chunk written then
// fails. Once the server is back, each open file of the writer gets the
// error once from a write and once from fsync or close: a file whose
// fsync reported it closes cleanly, one that did not fails its close; the
// file's length stops where the lost bytes begin, so reading it back
// (from another mount) gives exactly what was stored, no zeros.
func TestFailureWriteBackErrorExact(t *testing.T) {
	c := newFailCluster(t, 1, []string{"--stripe-count", "1"}, nil)
	mnt := c.mount("--on-unavailable", "fail", "--unavailable-timeout", "2s")
	p := filepath.Join(mnt, "lost")
	first := pattern("first", 1<<20)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(first); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	g, err := os.OpenFile(p, os.O_RDWR, 0) // a second open file description
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	c.data[0].proc.Kill(t, syscall.SIGKILL)
	if _, err := f.WriteAt(pattern("lost", 1<<20), 1<<20); err != nil { // buffered: its send fails later
		t.Fatalf("write while the data server is down: %v", err)
	}
	c.waitLog("mount1", "write-back of buffered data failed")
	c.startData(c.data[0])
	c.waitFor("a read through the mount", failWait, func() bool {
		r, err := os.Open(p)
		if err != nil {
			return false
		}
		defer r.Close()
		_, err = r.ReadAt(make([]byte, 4096), 0)
		return err == nil
	})

	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 1<<20+4096); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of the lost bytes: %v, want EIO (not zeros)", err)
	}
	for _, w := range []struct {
		name string
		file *os.File
	}{{"first open", f}, {"second open", g}} {
		_, err := w.file.WriteAt([]byte("again"), 0)
		wantErrno(t, w.name+": first write after the failure", err, syscall.EIO)
		for i := range 3 {
			if _, err := w.file.WriteAt([]byte("again"), 0); err != nil {
				t.Errorf("%s: write %d after the failure was reported: %v", w.name, i+2, err)
			}
		}
	}
	wantErrno(t, "first fsync after the failure", f.Sync(), syscall.EIO)
	if err := f.Sync(); err != nil {
		t.Errorf("second fsync: %v (the failure was reported)", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("close of the file whose fsync reported the failure: %v", err)
	}
	wantErrno(t, "close of the open file that never reported the failure", g.Close(), syscall.EIO)

	other := c.mount()
	got, err := os.ReadFile(filepath.Join(other, "lost"))
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte("again"), first[5:]...)
	if !bytes.Equal(got, want) {
		t.Errorf("file reads back %d bytes (first difference at %d), want the %d bytes stored before the failure",
			len(got), firstDiff(got, want), len(want))
	}
}

// loopTarget makes an ext4 file system of size bytes in an image file,
// mounts it (errors=remount-ro, no reserved blocks) and returns its mount
// point; it is unmounted when the test ends.
func loopTarget(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		if f, cerr := os.Create(img); cerr == nil {
			f.Close()
		}
		if err := os.Truncate(img, size); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Skipf("%s %s: %v: %s (needs loop devices and mkfs.ext4)", name, strings.Join(args, " "), err, out)
		}
	}
	run("mkfs.ext4", "-q", "-m", "0", "-F", img)
	run("mount", "-o", "loop,errors=remount-ro", img, mnt)
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	return mnt
}

// breakDisk makes the ext4 file system at mnt read-only (an ext4 error
// with errors=remount-ro), failed (shut down: every operation gets EIO)
// or full.
func breakDisk(t *testing.T, mnt, how string) {
	t.Helper()
	switch how {
	case "read-only":
		var st syscall.Stat_t
		if err := syscall.Stat(mnt, &st); err != nil {
			t.Fatal(err)
		}
		dev := fmt.Sprintf("/sys/fs/ext4/loop%d/trigger_fs_error", unix.Minor(st.Dev))
		if err := os.WriteFile(dev, []byte("weft test\n"), 0o200); err != nil {
			t.Skipf("cannot make an ext4 error: %v", err)
		}
	case "failed":
		d, err := os.Open(mnt)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		const ext4Shutdown = 0x8004587d // EXT4_IOC_SHUTDOWN
		if err := unix.IoctlSetPointerInt(int(d.Fd()), ext4Shutdown, 2 /* EXT4_GOING_FLAGS_NOLOGFLUSH */); err != nil {
			t.Skipf("cannot shut the file system down: %v", err)
		}
	case "full":
		var st unix.Statfs_t
		if err := unix.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(mnt, "filler"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// Everything but a few blocks; then whatever allocation left.
		left := int64(st.Bavail)*st.Bsize - 64<<10
		if err := unix.Fallocate(int(f.Fd()), 0, 0, left); err != nil {
			t.Fatal(err)
		}
		for i := int64(0); ; i++ {
			if err := unix.Fallocate(int(f.Fd()), 0, left+i*4096, 4096); err != nil {
				break
			}
		}
	}
}

// TestFailureTargetFaults: a target whose disk turns read-only, fails or
// fills up under a file being written. With one replica the writer gets
// EIO (ENOSPC when full) from weft, never EROFS, and the file keeps only
// what was stored; with two, the target leaves its chains and the writer
// sees nothing. weft status says HEALTH_WARN naming the target, its
// server and the reason; new files are placed where they can be written.
func TestFailureTargetFaults(t *testing.T) {
	for _, tt := range []struct {
		how       string
		replicas  int
		wantErrno syscall.Errno // 0: no error
	}{
		{"read-only", 1, syscall.EIO},
		{"failed", 1, syscall.EIO},
		{"full", 1, syscall.ENOSPC},
		{"read-only", 2, 0},
	} {
		t.Run(fmt.Sprintf("%s/replicas=%d", tt.how, tt.replicas), func(t *testing.T) {
			var disk string
			meta := []string{"--stripe-count", "2", "--replicas", fmt.Sprint(tt.replicas)}
			c := newFailCluster(t, 2, meta, func(i int) []string {
				if i != 2 {
					return nil
				}
				disk = loopTarget(t, 256<<20)
				return []string{"--target", disk}
			})
			c.leavesDamage("chain_not_checked") // the broken target stays offline
			if tt.replicas > 1 {
				c.waitHealthy(uint32(tt.replicas), failWait)
			}
			mnt := c.mount()
			p := filepath.Join(mnt, "spread")
			// Two chunks: one on each chain.
			before := pattern("before", 2<<20)
			if err := os.WriteFile(p, before, 0o644); err != nil {
				t.Fatal(err)
			}
			breakDisk(t, disk, tt.how)

			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			var after []byte
			var werr error
			for i := 0; i < 4 && werr == nil; i++ { // two more chunks on each chain
				chunk := pattern(fmt.Sprint("after", i), 1<<20)
				after = append(after, chunk...)
				_, werr = f.Write(chunk)
			}
			if werr == nil {
				werr = f.Sync()
			}
			cerr := f.Close()
			t.Logf("writer got %v; close %v", werr, cerr)
			if tt.wantErrno == 0 {
				if werr != nil || cerr != nil {
					t.Errorf("writer got %v, close %v; want no error (the other replica takes the writes)", werr, cerr)
				}
			} else {
				wantErrno(t, "write or fsync onto the broken target", werr, tt.wantErrno)
			}
			if errors.Is(werr, syscall.EROFS) || errors.Is(cerr, syscall.EROFS) {
				t.Errorf("EROFS of the data server's disk reached the writer: %v / %v", werr, cerr)
			}

			got, err := os.ReadFile(p)
			switch {
			case err != nil && (tt.how == "read-only" || tt.replicas > 1):
				t.Errorf("read back: %v", err)
			case err != nil:
			case tt.wantErrno == 0 && !bytes.Equal(got, append(before, after...)):
				t.Errorf("file reads back wrong: %d bytes, first difference at %d", len(got), firstDiff(got, append(before, after...)))
			case !bytes.HasPrefix(got, before):
				t.Errorf("file reads back wrong: first difference at %d", firstDiff(got, before))
			case len(got) > len(before) && !bytes.HasPrefix(after, got[len(before):]):
				// What was committed past the first two chunks must be
				// what was written, not zeros.
				t.Errorf("the file's committed length covers bytes that were not stored (first difference at %d)",
					len(before)+firstDiff(got[len(before):], after))
			}

			var st *weftv1.StatusResponse
			c.waitFor("status to show the broken target", failWait, func() bool {
				st, err = c.status()
				return err == nil && brokenTarget(st, tt.how) != ""
			})
			health, why := clusterHealth(st)
			line := brokenTarget(st, tt.how)
			t.Logf("%s: %s; warnings: %q", health, strings.Join(why, "; "), st.GetWarnings())
			if health != healthWarn || !strings.Contains(strings.Join(why, "; "), line) {
				t.Errorf("health %s (%s), want %s naming %q", health, strings.Join(why, "; "), healthWarn, line)
			}
			if !slicesContainsSubstr(st.GetWarnings(), disk) {
				t.Errorf("no warning names the target's path %s: %q", disk, st.GetWarnings())
			}

			// New files go where they can be written: written and synced
			// without error.
			for i := range 6 {
				q := filepath.Join(mnt, fmt.Sprintf("new%d", i))
				if err := writeSync(q, pattern(q, 2<<20)); err != nil {
					t.Errorf("new file %d: %v", i, err)
				}
			}
		})
	}
}

// brokenTarget returns the health reason naming the target with fault
// kind how ("" if none has it).
func brokenTarget(st *weftv1.StatusResponse, how string) string {
	for _, s := range st.GetServers() {
		for _, t := range s.GetTargets() {
			if t.GetFaultKind() == how {
				return fmt.Sprintf("target %d on data server %d %s", t.GetId(), s.GetId(), how)
			}
		}
	}
	return ""
}

func slicesContainsSubstr(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// writeSync writes data to a new file p, fsyncs and closes it.
func writeSync(p string, data []byte) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// TestCloseSyncOption: with --close-sync a close returns once the file's
// chunk is on the data server's disk; without, once the server holds it
// in memory. The kernel tells which (cachestat(2) on the chunk's file on
// the data server's target, an ext4 disk here): no dirty or writeback
// page of its data right after a close with --close-sync, dirty pages without (small
// writes are left to the kernel's write-back, which waits 30 s).
func TestCloseSyncOption(t *testing.T) {
	c := newFailCluster(t, 1, []string{"--stripe-count", "1"}, nil)
	var st unix.Statfs_t
	if err := unix.Statfs(c.data[0].dir, &st); err != nil || st.Type == unix.TMPFS_MAGIC {
		t.Skipf("the data server's target must be on a disk to tell synced pages from dirty ones (statfs: %v)", err)
	}
	for _, tt := range []struct {
		args      []string
		wantDirty bool
	}{
		{[]string{"--close-sync"}, false},
		{nil, true},
		{[]string{"--close-sync=false"}, true},
	} {
		t.Run(strings.Join(append([]string{"mount"}, tt.args...), " "), func(t *testing.T) {
			mnt := c.mount(tt.args...)
			p := filepath.Join(mnt, fmt.Sprintf("closed-%d", c.mounts))
			if err := os.WriteFile(p, pattern(p, 64<<10), 0o644); err != nil {
				t.Fatal(err)
			}
			chunk := filepath.Join(c.data[0].dir, chunkRel(inoOf(t, p), 0))
			f, err := os.Open(chunk)
			if err != nil {
				t.Fatalf("the chunk's file on the data server: %v", err)
			}
			defer f.Close()
			// The chunk's data (2 MiB in; its head holds a record of the
			// last sync, written after it).
			var cs unix.Cachestat_t
			if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: 2 << 20}, &cs, 0); err != nil {
				t.Skipf("cachestat: %v (Linux 6.5 or later)", err)
			}
			t.Logf("chunk file pages: %d cached, %d dirty, %d under write-back", cs.Cache, cs.Dirty, cs.Writeback)
			if dirty := cs.Dirty+cs.Writeback > 0; dirty != tt.wantDirty {
				t.Errorf("pages not on the disk right after the close: %d dirty, %d under write-back; want some: %v",
					cs.Dirty, cs.Writeback, tt.wantDirty)
			}
			if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, pattern(p, 64<<10)) {
				t.Errorf("read back: %v", err)
			}
		})
	}
}
