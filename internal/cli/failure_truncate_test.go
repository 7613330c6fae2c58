package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestFailureTruncateWhileDataServerDies: replicas 2 on 3 data servers; a
// data server is killed and a file striped over its chains is truncated
// at once. The cut waits for the cluster manager to take the dead member
// out of its chains and goes through on the others: the truncate
// succeeds, and the file is what it says (its bytes up to the new length
// intact). It used to fail with EIO after some chains were cut, leaving
// acknowledged bytes zero under the old length.
func TestFailureTruncateWhileDataServerDies(t *testing.T) {
	c := newFailCluster(t, 3, []string{"--replicas", "2"}, nil)
	c.waitHealthy(2, failWait)
	mnt := c.mount()
	p := filepath.Join(mnt, "f")
	want := pattern("f", 6<<20)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}

	c.data[0].proc.Kill(t, syscall.SIGKILL)
	const size = 1<<20 + 12345
	start := time.Now()
	if err := f.Truncate(size); err != nil {
		t.Fatalf("truncate while a data server of the file's chains just died: %v", err)
	}
	t.Logf("truncate took %v with a data server just killed", time.Since(start).Round(time.Millisecond))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(c.mount(), "f"))
	if err != nil || !bytes.Equal(got, want[:size]) {
		t.Fatalf("the truncated file through a fresh mount: %d bytes (want %d), %v, equal %v", len(got), size, err, bytes.Equal(got, want[:min(size, len(got))]))
	}
}
