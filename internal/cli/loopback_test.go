package cli

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/splice"
	"github.com/weft-fs/weft/internal/testcluster"
)

func TestSpliceLimit(t *testing.T) {
	page := os.Getpagesize()
	for _, tc := range []struct {
		maxPipe, want int
	}{
		{1 << 20, 1<<20 - page - fuseReplyHeader},
		{2 << 20, 2<<20 - page - fuseReplyHeader},
		{page, 0},
		{0, 0},
	} {
		if got := spliceLimit(tc.maxPipe); got != tc.want {
			t.Errorf("spliceLimit(%d) = %d, want %d", tc.maxPipe, got, tc.want)
		}
	}
}

// TestLoopbackLargeReads reads a file through weft loopback with reads
// larger than a pipe can splice (1 MiB on a stock system): they are
// answered from a buffer, without a failed splice and a log line each.
func TestLoopbackLargeReads(t *testing.T) {
	testcluster.NeedFUSE(t)
	dir := t.TempDir()
	src, mnt := filepath.Join(dir, "src"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 8<<20)
	rand.Read(want)
	if err := os.WriteFile(filepath.Join(src, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	m := startMounter(t, mnt, "loopback", "--debug", src, mnt)
	got, err := os.ReadFile(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the file read through the loopback differs from the backing file")
	}
	// A file created through the mount reads back too (Create's handle).
	if err := os.WriteFile(filepath.Join(mnt, "g"), want[:3<<20], 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(src, "g")); err != nil || !bytes.Equal(got, want[:3<<20]) {
		t.Fatalf("file written through the loopback: %v (%d bytes)", err, len(got))
	}
	m.stop(t)

	log := m.Output()
	if strings.Contains(log, "trySplice") {
		t.Errorf("the loopback tried to splice reads a pipe cannot hold:\n%s", firstLines(log, "trySplice", 3))
	}
	// The check above means something only if reads too large to
	// splice reached the loopback.
	largest := 0
	for _, m := range regexp.MustCompile(`READ n\d+ \{Fh \d+ \[\d+ \+(\d+)\)`).FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		largest = max(largest, n)
	}
	limit := spliceLimit(splice.MaxPipeSize())
	t.Logf("largest read %d bytes, splice limit %d", largest, limit)
	if largest == 0 {
		t.Fatalf("no READ in the loopback's debug log:\n%s", log)
	}
	if largest <= limit {
		t.Skipf("fs.pipe-max-size (%d) holds the largest read (%d): nothing to check", splice.MaxPipeSize(), largest)
	}
}

// firstLines returns up to n lines of s that contain sub.
func firstLines(s, sub string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
