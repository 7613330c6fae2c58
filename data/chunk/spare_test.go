package chunk

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// inodeOf returns the inode number of the file at path.
func inodeOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestSpareFilesReused checks that the files of deleted chunks make the
// files of new ones (no create), emptied, with the data and usage right,
// and that the pool is bounded.
func TestSpareFilesReused(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	const size = 3*BlockSize + 123
	a, b := ID{Ino: 5, Index: 0}, ID{Ino: 6, Index: 0}
	if _, err := tg.Write(a, 1, 0, pattern(1, size), MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	old := inodeOf(t, tg.inlinePath(a))
	if err := tg.DeleteFile(a.Ino); err != nil {
		t.Fatal(err)
	}
	if n := tg.SpareFiles(); n != 1 {
		t.Fatalf("%d spare files after deleting a chunk, want 1", n)
	}
	// Emptied in batches, once their move out of the chunk tree is
	// durable.
	tg.readySpares()
	entries, err := os.ReadDir(tg.spareDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err != nil || info.Size() != 0 {
			t.Fatalf("spare %s: %v, size %d; want an empty file", e.Name(), err, info.Size())
		}
	}
	if u, _ := tg.Usage(); u.Chunks != 0 || u.UsedBytes != 0 {
		t.Fatalf("usage after the delete: %+v", u)
	}
	small := pattern(2, 1000)
	if _, err := tg.Write(b, 1, 0, small, MaxChunkSize, true); err != nil {
		t.Fatal(err)
	}
	if n := tg.SpareFiles(); n != 0 {
		t.Fatalf("%d spare files after writing a new chunk, want 0 (reused)", n)
	}
	if inodeOf(t, tg.inlinePath(b)) != old {
		t.Errorf("%s was created anew, not made from a spare", filepath.Base(tg.inlinePath(b)))
	}
	if info, err := os.Stat(tg.inlinePath(b)); err != nil || info.Mode().Perm() != dataModeFresh {
		t.Fatalf("new chunk file: %v, mode %v; want %o", err, info.Mode(), dataModeFresh)
	}
	checkChunk(t, tg, b, small)
	if u, _ := tg.Usage(); u.Chunks != 1 || u.UsedBytes != uint64(len(small)) {
		t.Fatalf("usage after the new chunk: %+v", u)
	}

	// The pool is bounded: past maxSpare, files are removed.
	for i := range maxSpare + 3 {
		id := ID{Ino: 100, Index: uint64(i)}
		if _, err := tg.Write(id, 1, 0, small[:10], MaxChunkSize, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := tg.DeleteFile(100); err != nil {
		t.Fatal(err)
	}
	if n := tg.SpareFiles(); n != maxSpare {
		t.Fatalf("%d spare files, want the bound %d", n, maxSpare)
	}
	if entries, _ := os.ReadDir(tg.spareDir()); len(entries) != maxSpare {
		t.Fatalf("%d files in the spare directory, want %d", len(entries), maxSpare)
	}
}

// TestHandedOutFileNeverHoldsOtherData checks that a chunk file handed to
// a client for reading in place never becomes another chunk's file (the
// client may still read through its descriptor): it is removed, not kept
// as a spare, when its chunk is deleted.
func TestHandedOutFileNeverHoldsOtherData(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	a := ID{Ino: 7, Index: 0}
	secret := pattern(3, 2*BlockSize)
	if _, err := tg.Write(a, 1, 0, secret, MaxChunkSize, true); err != nil {
		t.Fatal(err)
	}
	o, err := tg.OpenForRead(a, false, 0, 0)
	f := o.File
	if err != nil || f == nil {
		t.Fatalf("open for reading in place: %v, %v", f, err)
	}
	defer f.Close()
	var held syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &held); err != nil {
		t.Fatal(err)
	}
	if held.Mode&0o777 != dataModeHandedOut {
		t.Fatalf("handed-out data file has mode %o, want %o", held.Mode&0o777, dataModeHandedOut)
	}
	// The verifying open (through the file cache) marks the file too.
	v := ID{Ino: 9, Index: 0}
	if _, err := tg.Write(v, 1, 0, secret, MaxChunkSize, true); err != nil {
		t.Fatal(err)
	}
	vo, err := tg.OpenForRead(v, true, 0, 0)
	if err != nil || vo.File == nil {
		t.Fatalf("open for reading in place, verified: %v, %v", vo.File, err)
	}
	vo.File.Close()
	if info, err := os.Stat(tg.inlinePath(v)); err != nil || info.Mode().Perm() != dataModeHandedOut {
		t.Fatalf("data file handed out by a verified open: %v, mode %v; want %o", err, info.Mode(), dataModeHandedOut)
	}
	if err := tg.DeleteFile(a.Ino); err != nil {
		t.Fatal(err)
	}
	// It is not a spare.
	tg.spare.mu.Lock()
	for _, n := range tg.spare.names {
		if inodeOf(t, tg.sparePath(n)) == held.Ino {
			t.Error("the handed-out chunk file is a spare")
		}
	}
	tg.spare.mu.Unlock()
	for i := range 3 {
		id := ID{Ino: 8, Index: uint64(i)}
		if _, err := tg.Write(id, 1, 0, pattern(10+i, BlockSize), MaxChunkSize, false); err != nil {
			t.Fatal(err)
		}
		if inodeOf(t, tg.inlinePath(id)) == held.Ino {
			t.Fatalf("the chunk file a client holds became the file of %v", id)
		}
	}
	got := make([]byte, len(secret))
	n, _ := f.ReadAt(got, o.DataOffset)
	if n > 0 && !bytes.Equal(got[:n], secret[:n]) {
		t.Fatal("a client's descriptor of a deleted chunk shows other bytes than the chunk's")
	}
}

// TestSparesRemovedAtOpen checks that spares left by an earlier run (which
// may hold data after a crash) are removed when the target opens.
func TestSparesRemovedAtOpen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open([]string{dir}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tg := s.Targets()[0]
	left := filepath.Join(tg.spareDir(), "77")
	if err := os.WriteFile(left, []byte("data of a chunk deleted just before a crash"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open([]string{dir}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("spare left by an earlier run: %v; want it removed", err)
	}
	if n := s.Targets()[0].SpareFiles(); n != 0 {
		t.Fatalf("%d spare files after opening, want 0", n)
	}
}
