package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/data/chunk"
)

// chunkRel is the path of the file of chunk index of inode ino below a
// target.
func chunkRel(ino, index uint64) string {
	return filepath.Join("chunks", fmt.Sprintf("%02x", ino%256), fmt.Sprintf("%x", ino), fmt.Sprint(index)+".w")
}

// inoOf is the inode number of a file on a mount.
func inoOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// flipByte inverts one byte of a file in place.
func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// readUncached reads a file after dropping its pages from the kernel's
// cache, so that the read reaches the file system (a weft mount keeps the
// cache of files that did not change).
func readUncached(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// sameFiles reports whether two files have the same bytes.
func sameFiles(a, b string) bool {
	x, err1 := os.ReadFile(a)
	y, err2 := os.ReadFile(b)
	if err1 != nil || err2 != nil {
		return false
	}
	cx, err1 := chunk.Decode(x)
	cy, err2 := chunk.Decode(y)
	return err1 == nil && err2 == nil && cx.Version == cy.Version && cx.Chain == cy.Chain && bytes.Equal(cx.Data, cy.Data)
}

// TestCorruptChunkRepaired damages one replica of a chunk of each of two
// replicas-2 files. The first is read through a fresh mount: the reads
// return the right bytes and the bad copy is repaired from the good one.
// The second is never read: weft scrub finds and repairs it (the
// background scrub is off, so the repair is the command's).
func TestCorruptChunkRepaired(t *testing.T) {
	c := newFailCluster(t, 2, []string{"--replicas", "2"}, func(int) []string { return []string{"--scrub-rate", "0"} })
	c.waitHealthy(2, failWait)
	mnt := c.mount()
	const size = 4<<20 + 777
	for _, name := range []string{"read-repaired", "scrub-repaired"} {
		if err := os.WriteFile(filepath.Join(mnt, name), pattern(name, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dirs := []string{c.data[0].dir, c.data[1].dir}
	damage := func(name string, index uint64, bad int) (badPath, goodPath string) {
		rel := chunkRel(inoOf(t, filepath.Join(mnt, name)), index)
		badPath, goodPath = filepath.Join(dirs[bad], rel), filepath.Join(dirs[1-bad], rel)
		if !sameFiles(badPath, goodPath) {
			t.Fatalf("chunk %s of %s is not the same on both targets before the damage", rel, name)
		}
		flipByte(t, badPath, 2<<20+70000) // second 64 KiB block of the data, which starts 2 MiB in
		t.Logf("flipped a byte of %s (%s)", badPath, name)
		return badPath, goodPath
	}
	scrubBad, scrubGood := damage("scrub-repaired", 1, 1)
	// The replica comparison of the other tests sees the damage.
	if _, diffs := c.replicaDiffs(2); len(diffs) != 1 {
		t.Errorf("replica comparison after damaging one copy: %q, want one difference", diffs)
	}
	readBad, readGood := damage("read-repaired", 0, 0)

	// Reads through fresh mounts always return the right bytes; one of
	// them hits the bad copy, which gets repaired.
	want := pattern("read-repaired", size)
	fresh := c.mount()
	corruptAt := time.Now()
	reads := 0
	for !sameFiles(readBad, readGood) {
		if time.Since(corruptAt) > 30*time.Second {
			t.Fatalf("the damaged copy %s was not repaired within 30s (%d reads through the mount)", readBad, reads)
		}
		got, err := readUncached(filepath.Join(fresh, "read-repaired"))
		reads++
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %d of the file with a damaged replica: err %v, correct %v", reads, err, bytes.Equal(got, want))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a damaged copy read through the mount was repaired %v after the damage (%d reads, all correct)",
		time.Since(corruptAt).Round(time.Millisecond), reads)

	// weft scrub runs a pass on every data server now: data server 2
	// finds the bad copy and repairs it before the command returns.
	if sameFiles(scrubBad, scrubGood) {
		t.Fatalf("%s was repaired before the scrub (it was never read)", scrubBad)
	}
	scrubStart := time.Now()
	out, err := exec.Command(c.exe, "scrub", "--meta", c.metaAddr).CombinedOutput()
	t.Logf("weft scrub (%v):\n%s", time.Since(scrubStart).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("weft scrub: %v", err)
	}
	for _, re := range []string{
		// Each holds both files: 2 x 5 chunks of 1 MiB (the last short); a
		// bad copy's bytes are not counted as verified.
		`(?m)^data server [12] \(127\.0\.0\.1:[0-9]+\): 10 chunks, 8\.0 MiB verified, 0 bad copies found, 0 repaired$`,
		`(?m)^data server [12] \(127\.0\.0\.1:[0-9]+\): 10 chunks, [0-9.]+ MiB verified, 1 bad copy found, 1 repaired$`,
		`(?m)^total \(2 data servers\): 20 chunks, [0-9.]+ MiB verified, 1 bad copy found, 1 repaired$`,
	} {
		if !regexp.MustCompile(re).Match(out) {
			t.Errorf("weft scrub output does not match %s", re)
		}
	}
	if !sameFiles(scrubBad, scrubGood) {
		t.Fatalf("weft scrub returned but %s is still damaged", scrubBad)
	}
	logs, _ := os.ReadFile(filepath.Join(c.base, "logs", "data2.log"))
	if !strings.Contains(string(logs), "repaired chunk") {
		t.Errorf("data server 2 did not log the repair")
	}
	got, err := os.ReadFile(filepath.Join(c.mount(), "scrub-repaired"))
	if err != nil || !bytes.Equal(got, pattern("scrub-repaired", size)) {
		t.Errorf("scrub-repaired through a fresh mount: err %v, correct %v", err, bytes.Equal(got, pattern("scrub-repaired", size)))
	}
	c.checkReplicasIdentical(2)
}
