package cli

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// mountProcess is a weft command that mounts (weft mount, weft loopback)
// running as an OS process.
type mountProcess struct {
	dir    string
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error
}

// startMount runs weft mount on dir against the meta service at metaAddr
// and waits until it is mounted.
func startMount(t *testing.T, metaAddr, dir string) *mountProcess {
	t.Helper()
	cmd := exec.Command(needWeftBinary(t), "mount", "--meta", metaAddr, "--entry-timeout", "1s", "--attr-timeout", "1s", dir)
	cmd.Env = append(os.Environ(), "WEFT_RUNTIME_DIR="+filepath.Join(filepath.Dir(dir), "run"))
	return startMounter(t, dir, cmd)
}

// startMounter starts cmd, a weft command that mounts dir and runs until
// SIGINT, and waits until dir is mounted.
func startMounter(t *testing.T, dir string, cmd *exec.Cmd) *mountProcess {
	t.Helper()
	m := &mountProcess{dir: dir, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m.cmd.Stderr = m.stderr
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		m.err = m.cmd.Wait()
		close(m.done)
	}()
	t.Cleanup(func() {
		select {
		case <-m.done:
		default:
			syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			select {
			case <-m.done:
			case <-time.After(10 * time.Second):
				cleanupUnder(dir)
				<-m.done
			}
		}
		if isMountPoint(dir) {
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for !isMountPoint(dir) {
		select {
		case <-m.done:
			t.Fatalf("%s exited: %v\n%s", m.cmd, m.err, m.stderr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not mount %s in time\n%s", m.cmd, dir, m.stderr)
		}
	}
	return m
}

// stop sends SIGINT and checks that the command exits 0 and unmounted.
func (m *mountProcess) stop(t *testing.T) {
	t.Helper()
	m.cmd.Process.Signal(os.Interrupt)
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop\n%s", m.cmd, m.stderr)
	}
	if m.err != nil {
		t.Errorf("%s exited with %v\n%s", m.cmd, m.err, m.stderr)
	}
	if isMountPoint(m.dir) {
		t.Errorf("%s still mounted after %s stopped", m.dir, m.cmd)
	}
}

func TestTwoMountsCloseToOpen(t *testing.T) {
	needFUSE(t)
	c := testcluster.Start(t, testcluster.Options{DataServers: 2, Layout: &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 2}})
	base := t.TempDir()
	t.Cleanup(func() { cleanupUnder(base) })
	a := startMount(t, c.MetaAddr(), filepath.Join(base, "a"))
	b := startMount(t, c.MetaAddr(), filepath.Join(base, "b"))
	inA := func(p string) string { return filepath.Join(a.dir, p) }
	inB := func(p string) string { return filepath.Join(b.dir, p) }

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

	a.stop(t)
	b.stop(t)
}
