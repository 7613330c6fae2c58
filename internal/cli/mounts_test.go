package cli

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// mountProcess is a weft command that mounts (weft loopback) running as
// an OS process.
type mountProcess struct {
	dir string
	*testcluster.Proc
}

// startMounter runs weft with args, a command that mounts dir and runs
// until SIGINT, and waits until dir is mounted.
func startMounter(t *testing.T, dir string, args ...string) *mountProcess {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &mountProcess{dir: dir, Proc: testcluster.StartProc(t, "weft "+args[0], testcluster.ProcOptions{}, args...)}
	t.Cleanup(func() {
		if testcluster.IsMountPoint(dir) {
			testcluster.CleanupUnder(dir)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for !testcluster.IsMountPoint(dir) {
		select {
		case <-m.Done():
			t.Fatalf("%s exited: %v\n%s", m.Cmd, m.Err(), m.Output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not mount %s in time\n%s", m.Cmd, dir, m.Output())
		}
	}
	return m
}

// stop sends SIGINT and checks that the command exits 0 and unmounted.
func (m *mountProcess) stop(t *testing.T) {
	t.Helper()
	m.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop\n%s", m.Cmd, m.Output())
	}
	if m.Err() != nil {
		t.Errorf("%s exited with %v\n%s", m.Cmd, m.Err(), m.Output())
	}
	if testcluster.IsMountPoint(m.dir) {
		t.Errorf("%s still mounted after %s stopped", m.dir, m.Cmd)
	}
}

func TestTwoMountsCloseToOpen(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{DataServers: 2, Layout: &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 2}})
	// Both mounts are stopped at the end of the test, which checks that
	// they exit 0 and unmount.
	a := c.Mount("--entry-timeout", "1s", "--attr-timeout", "1s")
	b := c.Mount("--entry-timeout", "1s", "--attr-timeout", "1s")
	inA := func(p string) string { return filepath.Join(a, p) }
	inB := func(p string) string { return filepath.Join(b, p) }

	// Written and closed on A, read after open on B.
	first := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes, 5 chunks
	if err := os.WriteFile(inA("shared"), first, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(inB("shared"))
	if err != nil || !bytes.Equal(got, first) {
		t.Fatalf("B reads %d bytes (err %v), want what A wrote (%d bytes)", len(got), err, len(first))
	}

	// Rewritten in place on A (same size), B sees the new bytes on its
	// next open.
	second := bytes.Repeat([]byte("FEDCBA9876543210"), 20000)
	if err := os.WriteFile(inA("shared"), second, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // attribute timeout of B
	got, err = os.ReadFile(inB("shared"))
	if err != nil || !bytes.Equal(got, second) {
		t.Fatalf("B does not see A's rewrite after open (err %v)", err)
	}

	// Grown on A (append), B sees the new size and bytes.
	f, err := os.OpenFile(inA("shared"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("tail"))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	got, err = os.ReadFile(inB("shared"))
	if err != nil || !bytes.Equal(got, append(second, "tail"...)) {
		t.Fatalf("B does not see A's append (got %d bytes, err %v)", len(got), err)
	}

	// A rename and an unlink on A are seen on B after the entry timeout.
	if err := os.Mkdir(inA("dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(inA("shared"), inA("dir/renamed")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	if _, err := os.Stat(inB("shared")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("B still sees the old name after A renamed it: %v", err)
	}
	if got, err := os.ReadFile(inB("dir/renamed")); err != nil || !bytes.Equal(got, append(second, "tail"...)) {
		t.Errorf("B cannot read the renamed file: %v", err)
	}
	if err := os.Remove(inA("dir/renamed")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	if _, err := os.Stat(inB("dir/renamed")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("B still sees the file A unlinked: %v", err)
	}
}
