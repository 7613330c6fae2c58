package mount

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestMountedFileSystem(t *testing.T) {
	_, dir := mountCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 3, Replicas: 1})
	p := func(name string) string { return filepath.Join(dir, name) }

	t.Run("create write read stat", func(t *testing.T) {
		if err := os.WriteFile(p("a"), []byte("hello"), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p("a"))
		if err != nil || string(got) != "hello" {
			t.Fatalf("read %q, %v", got, err)
		}
		st, err := os.Stat(p("a"))
		if err != nil || st.Size() != 5 || st.Mode().Perm() != 0o640 || !st.Mode().IsRegular() {
			t.Fatalf("stat %v, %v", st, err)
		}
		f, err := os.OpenFile(p("a"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte(" world")); err != nil {
			t.Fatal(err)
		}
		if st, err := f.Stat(); err != nil || st.Size() != 11 {
			t.Errorf("size before close %v, %v; want 11", st.Size(), err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(p("a")); string(got) != "hello world" {
			t.Errorf("after append: %q", got)
		}
		if err := os.Truncate(p("a"), 4); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(p("a")); string(got) != "hell" {
			t.Errorf("after truncate: %q", got)
		}
		if _, err := os.OpenFile(p("a"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("O_EXCL on an existing file: %v, want EEXIST", err)
		}
	})

	t.Run("rename unlink readdir", func(t *testing.T) {
		if err := os.Mkdir(p("d"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"x", "y", "z"} {
			if err := os.WriteFile(p("d/"+n), []byte(n), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Rename(p("d/x"), p("d/w")); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p("d/y")); err != nil {
			t.Fatal(err)
		}
		ents, err := os.ReadDir(p("d"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"w", "z"}) {
			t.Errorf("readdir %v, want [w z]", names)
		}
		if err := os.Remove(p("d")); !errors.Is(err, syscall.ENOTEMPTY) {
			t.Errorf("rmdir of a non-empty directory: %v, want ENOTEMPTY", err)
		}
		if _, err := os.Stat(p("d/x")); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("stat of renamed-away name: %v, want ENOENT", err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, p("d/w"), unix.AT_FDCWD, p("d/z"), unix.RENAME_NOREPLACE); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("RENAME_NOREPLACE over an existing name: %v, want EEXIST", err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, p("d/w"), unix.AT_FDCWD, p("d/z"), unix.RENAME_EXCHANGE); err != nil {
			t.Errorf("RENAME_EXCHANGE: %v", err)
		} else if got, _ := os.ReadFile(p("d/w")); string(got) != "z" {
			t.Errorf("after exchange d/w holds %q, want z", got)
		}
	})

	t.Run("xattr", func(t *testing.T) {
		if err := os.WriteFile(p("xa"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(p("xa"), "user.color", []byte("blue"), 0); err != nil {
			t.Fatal(err)
		}
		if n, err := unix.Getxattr(p("xa"), "user.color", nil); err != nil || n != 4 {
			t.Errorf("size probe: %d, %v; want 4", n, err)
		}
		small := make([]byte, 2)
		if _, err := unix.Getxattr(p("xa"), "user.color", small); !errors.Is(err, syscall.ERANGE) {
			t.Errorf("small buffer: %v, want ERANGE", err)
		}
		buf := make([]byte, 64)
		if n, err := unix.Getxattr(p("xa"), "user.color", buf); err != nil || string(buf[:n]) != "blue" {
			t.Errorf("getxattr %q, %v", buf[:n], err)
		}
		if n, err := unix.Listxattr(p("xa"), buf); err != nil || string(buf[:n]) != "user.color\x00" {
			t.Errorf("listxattr %q, %v", buf[:n], err)
		}
		if err := unix.Removexattr(p("xa"), "user.color"); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Getxattr(p("xa"), "user.color", buf); !errors.Is(err, syscall.ENODATA) {
			t.Errorf("removed xattr: %v, want ENODATA", err)
		}
	})

	t.Run("symlink and link", func(t *testing.T) {
		if err := os.Symlink("a", p("ln")); err != nil {
			t.Fatal(err)
		}
		if target, err := os.Readlink(p("ln")); err != nil || target != "a" {
			t.Errorf("readlink %q, %v", target, err)
		}
		if got, err := os.ReadFile(p("ln")); err != nil || string(got) != "hell" {
			t.Errorf("read through symlink %q, %v", got, err)
		}
		if err := os.Link(p("a"), p("hard")); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(p("hard")); err != nil || st.Sys().(*syscall.Stat_t).Nlink != 2 {
			t.Errorf("nlink after link: %v", err)
		}
	})

	t.Run("shared writable mmap", func(t *testing.T) {
		// The mapping is used by another process: a page fault on a FUSE
		// mapping stalls its thread in the kernel, and in the process that
		// serves the mount that would block the garbage collector's
		// stop-the-world, and with it the server.
		cmd := exec.Command(os.Args[0], "-test.run=^TestMmapHelper$")
		cmd.Env = append(os.Environ(), "WEFT_MMAP_HELPER_FILE="+p("mm"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("mmap helper: %v\n%s", err, out)
		}
		got, err := os.ReadFile(p("mm"))
		if err != nil || !bytes.Equal(got, mmapPattern()) {
			t.Fatalf("mapped writes not in the file (%d bytes read, %v)", len(got), err)
		}
	})

	t.Run("10 MiB striped file", func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		want := make([]byte, 10<<20+4097)
		for i := range want {
			want[i] = byte(r.Uint32())
		}
		if err := os.WriteFile(p("big"), want, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p("big"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read back %d bytes differing from the %d written", len(got), len(want))
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil || st.Blocks == 0 {
			t.Errorf("statfs %+v, %v", st, err)
		}
	})

	t.Run("special files and times", func(t *testing.T) {
		if err := syscall.Mkfifo(p("fifo"), 0o600); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Lstat(p("fifo")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
			t.Errorf("fifo: %v, %v", st.Mode(), err)
		}
		if err := os.Chmod(p("a"), 0o600); err != nil {
			t.Fatal(err)
		}
		ts := []unix.Timespec{{Sec: 1000, Nsec: 5}, {Sec: 0, Nsec: unix.UTIME_OMIT}}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p("a"), ts, 0); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p("a"))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != 0o600 || sys.Atim.Sec != 1000 || sys.Atim.Nsec != 5 || sys.Mtim.Sec == 1000 {
			t.Errorf("after chmod and utimensat: mode %v atime %v mtime %v", st.Mode(), sys.Atim, sys.Mtim)
		}
	})

	t.Run("unlink", func(t *testing.T) {
		for _, n := range []string{"a", "hard", "ln", "mm", "big", "xa", "fifo"} {
			if err := os.Remove(p(n)); err != nil {
				t.Error(err)
			}
		}
		if _, err := os.Stat(p("a")); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("stat after unlink: %v", err)
		}
	})
}

func TestMountpointChecks(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "nope"), "does not exist"},
		{"not a directory", file, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkMountpoint(tt.path)
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tt.want)) {
				t.Errorf("checkMountpoint(%s) = %v, want an error saying %q", tt.path, err, tt.want)
			}
		})
	}
	if err := checkMountpoint(dir); err != nil {
		t.Errorf("a directory: %v", err)
	}
}

// TestCloseToOpenAcrossMounts checks that a mount that has a file's pages
// cached sees another mount's rewrite of the file (same length) when it
// opens the file again.
func TestCloseToOpenAcrossMounts(t *testing.T) {
	tc, a := mountCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 3, Replicas: 1})
	b := mountAt(t, tc)
	old := bytes.Repeat([]byte("1"), 100<<10)
	if err := os.WriteFile(filepath.Join(a, "f"), old, 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second read may come from b's page cache
		if got, err := os.ReadFile(filepath.Join(b, "f")); err != nil || !bytes.Equal(got, old) {
			t.Fatalf("b reads %d bytes, %v", len(got), err)
		}
	}
	upd := bytes.Repeat([]byte("2"), 100<<10)
	if err := os.WriteFile(filepath.Join(a, "f"), upd, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b, "f")); err != nil || !bytes.Equal(got, upd) {
		t.Fatalf("b does not see a's rewrite after opening again (%d bytes, %v)", len(got), err)
	}
	if err := os.WriteFile(filepath.Join(b, "g"), []byte("from b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(a, "g")); err != nil || string(got) != "from b" {
		t.Fatalf("a reads %q, %v", got, err)
	}
}

func mmapPattern() []byte {
	b := make([]byte, 200<<10)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// TestMmapHelper runs in a child process of TestMountedFileSystem: it
// writes a file through a shared writable mapping, msyncs and unmaps it.
func TestMmapHelper(t *testing.T) {
	path := os.Getenv("WEFT_MMAP_HELPER_FILE")
	if path == "" {
		t.Skip("runs as a child process of TestMountedFileSystem")
	}
	want := mmapPattern()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(len(want))); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem, want)
	if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
