package posixtest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// dirent is one entry returned by getdents64.
type dirent struct {
	ino  uint64
	typ  uint8
	name string
}

// parseDirents decodes the linux_dirent64 records in buf.
func parseDirents(t testing.TB, buf []byte) []dirent {
	t.Helper()
	var out []dirent
	for len(buf) > 0 {
		if len(buf) < 19 {
			t.Fatalf("getdents64: truncated record (%d bytes left)", len(buf))
		}
		reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
		if reclen < 19 || reclen > len(buf) {
			t.Fatalf("getdents64: bad record length %d (%d bytes left)", reclen, len(buf))
		}
		name := buf[19:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		out = append(out, dirent{ino: binary.NativeEndian.Uint64(buf[0:8]), typ: buf[18], name: string(name)})
		buf = buf[reclen:]
	}
	return out
}

// readBatch calls getdents64 once on fd with a buffer of bufSize bytes.
func readBatch(t testing.TB, fd int, bufSize int, path string) []dirent {
	t.Helper()
	buf := make([]byte, bufSize)
	n, err := unix.Getdents(fd, buf)
	must(t, err, "getdents64 %s", path)
	return parseDirents(t, buf[:n])
}

// readAllDirents lists path with getdents64 until the end.
func readAllDirents(t testing.TB, path string, bufSize int) []dirent {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err, "open %s", path)
	defer unix.Close(fd)
	var all []dirent
	for {
		batch := readBatch(t, fd, bufSize, path)
		if len(batch) == 0 {
			return all
		}
		all = append(all, batch...)
	}
}

// dirType maps st_mode to the d_type getdents64 should report.
func dirType(mode uint32) uint8 {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return unix.DT_REG
	case unix.S_IFDIR:
		return unix.DT_DIR
	case unix.S_IFLNK:
		return unix.DT_LNK
	case unix.S_IFIFO:
		return unix.DT_FIFO
	case unix.S_IFSOCK:
		return unix.DT_SOCK
	}
	return unix.DT_UNKNOWN
}

const readdirEntries = 2000

// fillDir creates readdirEntries entries in d: mostly files, and some
// directories, symlinks and FIFOs. It returns their names.
func fillDir(e *env, d string) []string {
	e.t.Helper()
	names := make([]string, 0, readdirEntries)
	for i := 0; i < readdirEntries; i++ {
		name := fmt.Sprintf("entry-%04d", i)
		p := e.path("d", name)
		switch i % 50 {
		case 1:
			must(e.t, unix.Mkdir(p, 0o755), "mkdir %s", p)
		case 2:
			must(e.t, unix.Symlink("target", p), "symlink %s", p)
		case 3:
			must(e.t, unix.Mkfifo(p, 0o644), "mkfifo %s", p)
		default:
			fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
			must(e.t, err, "create %s", p)
			unix.Close(fd)
		}
		names = append(names, name)
	}
	return names
}

var readdirTests = []testCase{
	{"ReaddirEmpty", func(e *env) {
		got := readAllDirents(e.t, e.dir, 4096)
		var names []string
		for _, d := range got {
			names = append(names, d.name)
			if d.typ != unix.DT_DIR {
				e.t.Errorf("getdents64 %s: %q has d_type %d, want DT_DIR", e.dir, d.name, d.typ)
			}
		}
		if !sameSet(names, []string{".", ".."}) {
			e.t.Errorf("getdents64 of empty %s: %q, want . and ..", e.dir, names)
		}
	}},
	{"Readdir2000", func(e *env) {
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		names := fillDir(e, d)
		for _, bufSize := range []int{64 * kib, 1 * kib} {
			seen := map[string]int{}
			for _, de := range readAllDirents(e.t, d, bufSize) {
				seen[de.name]++
				if de.name == "." || de.name == ".." {
					continue
				}
				st := lstat(e.t, e.path("d", de.name))
				if want := dirType(st.Mode); de.typ != want {
					e.t.Errorf("getdents64 %s: %q has d_type %d, want %d", d, de.name, de.typ, want)
				}
				if de.ino != st.Ino {
					e.t.Errorf("getdents64 %s: %q has d_ino %d, lstat says %d", d, de.name, de.ino, st.Ino)
				}
			}
			for _, name := range append([]string{".", ".."}, names...) {
				if seen[name] != 1 {
					e.t.Errorf("getdents64 %s (buffer %d): %q returned %d times, want once", d, bufSize, name, seen[name])
				}
				delete(seen, name)
			}
			for name := range seen {
				e.t.Errorf("getdents64 %s: unexpected entry %q", d, name)
			}
		}
	}},
	{"ReaddirWhileUnlinking", func(e *env) {
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		names := fillDir(e, d)
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(e.t, err, "open %s", d)
		defer unix.Close(fd)
		seen := map[string]int{}
		removed := map[string]bool{}
		next := len(names) - 1 // remove from the end of the name order
		for {
			batch := readBatch(e.t, fd, 2*kib, d)
			if len(batch) == 0 {
				break
			}
			for _, de := range batch {
				seen[de.name]++
			}
			// Each round removes one entry already returned and two that
			// probably were not.
			for _, de := range batch[:1] {
				if de.name != "." && de.name != ".." && !removed[de.name] {
					removeEntry(e, e.path("d", de.name))
					removed[de.name] = true
				}
			}
			for k := 0; k < 2 && next >= 0; next-- {
				if name := names[next]; !removed[name] && seen[name] == 0 {
					removeEntry(e, e.path("d", name))
					removed[name] = true
					k++
				}
			}
		}
		for name, n := range seen {
			if n > 1 {
				e.t.Errorf("getdents64 %s while unlinking: %q returned %d times", d, name, n)
			}
		}
		for _, name := range append([]string{".", ".."}, names...) {
			if !removed[name] && seen[name] != 1 {
				e.t.Errorf("getdents64 %s while unlinking: %q (never removed) returned %d times, want once", d, name, seen[name])
			}
		}
		for name := range seen {
			if name != "." && name != ".." && !slices.Contains(names, name) {
				e.t.Errorf("getdents64 %s: unexpected entry %q", d, name)
			}
		}
		// Rewinding restarts the listing with what is left.
		_, err = unix.Seek(fd, 0, unix.SEEK_SET)
		must(e.t, err, "rewinddir %s", d)
		left := 0
		for {
			batch := readBatch(e.t, fd, 64*kib, d)
			if len(batch) == 0 {
				break
			}
			left += len(batch)
		}
		if want := len(names) - len(removed) + 2; left != want {
			e.t.Errorf("getdents64 %s after rewind: %d entries, want %d", d, left, want)
		}
	}},
}

// removeEntry unlinks a file or removes an (empty) directory.
func removeEntry(e *env, p string) {
	e.t.Helper()
	err := unix.Unlink(p)
	if err == unix.EISDIR {
		err = unix.Rmdir(p)
	}
	must(e.t, err, "remove %s", p)
}
