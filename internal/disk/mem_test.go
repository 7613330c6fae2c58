package disk

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
)

func write(t *testing.T, fsys FS, name string, off int64, data []byte) File {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	return f
}

func read(fsys FS, name string) ([]byte, error) { return ReadFile(fsys, name) }

// TestMemCrashKeepsWhatWasSynced checks the model's promises over many
// crashes: synced bytes and entries always survive; unsynced pages
// survive or not one by one, never half.
func TestMemCrashKeepsWhatWasSynced(t *testing.T) {
	synced := bytes.Repeat([]byte{1}, 3*PageSize)
	later := bytes.Repeat([]byte{2}, 3*PageSize)
	seen := map[string]bool{}
	for seed := range uint64(200) {
		m := NewMem(0)
		if err := m.MkdirAll("/d", 0o700); err != nil {
			t.Fatal(err)
		}
		f := write(t, m, "/d/f", 0, synced)
		if err := f.Datasync(); err != nil {
			t.Fatal(err)
		}
		if err := m.SyncDir("/d"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(later, PageSize/2); err != nil { // spans four pages, none synced
			t.Fatal(err)
		}
		write(t, m, "/d/g", 0, []byte("unsynced file"))
		img := m.Crash(rand.New(rand.NewPCG(seed, 1)))
		if _, err := f.WriteAt([]byte{3}, 0); !errors.Is(err, ErrCrashed) {
			t.Fatalf("write after the crash: %v, want ErrCrashed", err)
		}
		got, err := read(img, "/d/f")
		if err != nil {
			t.Fatalf("seed %d: synced file lost: %v", seed, err)
		}
		if len(got) != 3*PageSize && len(got) != 3*PageSize+PageSize/2 {
			t.Fatalf("seed %d: size %d", seed, len(got))
		}
		for p := 0; p < 3; p++ {
			page := got[p*PageSize : (p+1)*PageSize]
			old := bytes.Equal(page, synced[:PageSize])
			var neu []byte
			if p == 0 {
				neu = append(append([]byte(nil), synced[:PageSize/2]...), later[:PageSize/2]...)
			} else {
				neu = later[:PageSize]
			}
			switch {
			case old:
				seen["old page"] = true
			case bytes.Equal(page, neu):
				seen["new page"] = true
			default:
				t.Fatalf("seed %d: page %d is neither old nor new", seed, p)
			}
		}
		if _, err := img.Lstat("/d/g"); err == nil {
			seen["unsynced file kept"] = true
		} else {
			seen["unsynced file lost"] = true
		}
	}
	for _, want := range []string{"old page", "new page", "unsynced file kept", "unsynced file lost"} {
		if !seen[want] {
			t.Errorf("200 crashes never gave %q", want)
		}
	}
}

func TestMemNamespaceChangesSurviveInOrder(t *testing.T) {
	for seed := range uint64(100) {
		m := NewMem(0)
		m.MkdirAll("/a", 0o700)
		m.MkdirAll("/b", 0o700)
		m.SyncFS("/")
		for i := range 5 {
			f := write(t, m, "/a/tmp", 0, []byte{byte(i)})
			f.Sync()
			if err := m.Rename("/a/tmp", "/b/f"); err != nil {
				t.Fatal(err)
			}
		}
		img := m.Crash(rand.New(rand.NewPCG(seed, 2)))
		// A prefix of the changes: /b/f, if there, holds the value of
		// some rename, and /a/tmp exists only if the last create did and
		// its rename did not.
		b, err := read(img, "/b/f")
		_, terr := img.Lstat("/a/tmp")
		if err == nil && (len(b) != 1 || b[0] > 4) {
			t.Fatalf("seed %d: /b/f = %v", seed, b)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if terr == nil && err == nil && b[0] == 4 {
			t.Fatalf("seed %d: both the last file and its renamed copy", seed)
		}
	}
}

func TestMemSyncDirMakesEntriesDurable(t *testing.T) {
	for seed := range uint64(50) {
		m := NewMem(0)
		m.MkdirAll("/d", 0o700)
		f := write(t, m, "/d/f", 0, []byte("x"))
		f.Datasync()
		m.SyncDir("/d")
		img := m.Crash(rand.New(rand.NewPCG(seed, 3)))
		if b, err := read(img, "/d/f"); err != nil || string(b) != "x" {
			t.Fatalf("seed %d: synced file and entry: %q, %v", seed, b, err)
		}
	}
}

func TestMemFullFileSystem(t *testing.T) {
	m := NewMem(4 * PageSize)
	f := write(t, m, "/f", 0, make([]byte, 3*PageSize))
	if _, err := f.WriteAt(make([]byte, 2*PageSize), 3*PageSize); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write past the capacity: %v, want ENOSPC", err)
	}
	if err := f.PunchHole(0, 2*PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 2*PageSize), 3*PageSize); err != nil {
		t.Fatalf("write after freeing room: %v", err)
	}
	if sp, _ := m.Statfs("/"); sp.Free != PageSize*1 {
		t.Fatalf("free %d, want %d", sp.Free, PageSize)
	}
}

func TestMemCrashAfter(t *testing.T) {
	m := NewMem(0)
	m.CrashAfter(2, rand.New(rand.NewPCG(1, 1)))
	f := write(t, m, "/f", 0, []byte("a")) // create, write
	if _, err := f.WriteAt([]byte("b"), 1); !errors.Is(err, ErrCrashed) {
		t.Fatalf("third change: %v, want ErrCrashed", err)
	}
	if m.Image() == nil {
		t.Fatal("no image after the crash")
	}
	if _, err := m.Lstat("/f"); !errors.Is(err, ErrCrashed) {
		t.Fatalf("use after the crash: %v", err)
	}
}

func TestMemImageIsDurable(t *testing.T) {
	m := NewMem(0)
	f := write(t, m, "/f", 0, []byte("synced"))
	f.Datasync()
	m.SyncFS("/")
	img := m.Crash(rand.New(rand.NewPCG(1, 1)))
	// Whatever a crash left is on the disk: a second crash keeps it.
	img2 := img.Crash(rand.New(rand.NewPCG(2, 2)))
	if b, err := read(img2, "/f"); err != nil || string(b) != "synced" {
		t.Fatalf("after two crashes: %q, %v", b, err)
	}
}
