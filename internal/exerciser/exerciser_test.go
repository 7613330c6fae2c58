package exerciser

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLocalDisk runs the exerciser on a directory of the local disk: the
// baseline that shows the model and the checks are right.
func TestLocalDisk(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"Chunk1MiB", Config{Ops: 3000, MaxFileSize: 6 << 20, Files: 3, ChunkSizeHint: 1 << 20}},
		{"Chunk64KiB", Config{Ops: 2000, MaxFileSize: 1 << 20, Files: 2, ChunkSizeHint: 64 << 10}},
		{"SmallFiles", Config{Ops: 2000, MaxFileSize: 100 << 10, Files: 4, ChunkSizeHint: 4 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			Run(t, t.TempDir(), tc.cfg)
		})
	}
}

// TestSameSeedSameFiles shows a run is determined by its seed.
func TestSameSeedSameFiles(t *testing.T) {
	cfg := Config{Seed: 42, Ops: 500, MaxFileSize: 512 << 10, Files: 2, ChunkSizeHint: 64 << 10}
	a, b := t.TempDir(), t.TempDir()
	Run(t, a, cfg)
	Run(t, b, cfg)
	for i := 0; i < cfg.Files; i++ {
		name := fmt.Sprintf("exerciser-%d", i)
		da, err := os.ReadFile(filepath.Join(a, name))
		if err != nil {
			t.Fatal(err)
		}
		db, err := os.ReadFile(filepath.Join(b, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(da, db) {
			t.Errorf("%s differs between two runs with seed %d (%d and %d bytes)", name, cfg.Seed, len(da), len(db))
		}
	}
}

// fatalTB records the message of Fatalf and stops the caller.
type fatalTB struct {
	testing.TB
	msg string
}

type stopped struct{}

func (f *fatalTB) Helper()             {}
func (f *fatalTB) Logf(string, ...any) {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(stopped{})
}

// TestReportsCorruption changes a byte behind the exerciser's back and
// checks the report names the seed, the operation and the offset.
func TestReportsCorruption(t *testing.T) {
	dir := t.TempDir()
	Run(t, dir, Config{Seed: 7, Ops: 300, MaxFileSize: 256 << 10, Files: 1, ChunkSizeHint: 4 << 10})
	p := filepath.Join(dir, "exerciser-0")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 100 {
		data = append(data, make([]byte, 100-len(data))...)
	}
	x := &exerciser{t: &fatalTB{TB: t}, cfg: Config{Seed: 7}, op: 12}
	f := &file{path: p, data: append([]byte{}, data...)}
	data[77] ^= 0xff
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stopped); !ok {
					panic(r)
				}
			}
		}()
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		f.fd = fd
		x.checkWhole(f, "check")
	}()
	msg := x.t.(*fatalTB).msg
	for _, want := range []string{"seed 7", "op #12", "first differing offset 77", SeedEnv + "=7"} {
		if !strings.Contains(msg, want) {
			t.Errorf("report %q does not contain %q", msg, want)
		}
	}
}

// TestFailedCloseIsNotRepeated checks that reopen forgets a descriptor
// whose close failed: close(2) frees the number even then, and closing it
// again (closeAll, after the failure) could close a file that an
// in-process file server opened meanwhile under the same number.
func TestFailedCloseIsNotRepeated(t *testing.T) {
	p := filepath.Join(t.TempDir(), "exerciser-0")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	x := &exerciser{t: &fatalTB{TB: t}}
	f := &file{path: p, fd: 1 << 30} // never open: its close fails with EBADF
	x.files = []*file{f}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stopped); !ok {
					panic(r)
				}
			}
		}()
		x.reopen(f, 0)
	}()
	if msg := x.t.(*fatalTB).msg; !strings.Contains(msg, "close") {
		t.Fatalf("reopen with a descriptor that fails to close reported %q", msg)
	}
	if f.fd != -1 {
		t.Fatalf("after a failed close the file still has descriptor %d, which closeAll closes again", f.fd)
	}
}
