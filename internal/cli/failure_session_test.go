package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// sessionIDs lists the ids of the sessions the meta service knows.
func (c *failCluster) sessionIDs() ([]string, error) {
	st, err := c.status()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range st.GetSessionList() {
		ids = append(ids, s.GetId())
	}
	return ids, nil
}

// TestFailureSessionExpiresWhileStopped: a mount stopped (SIGSTOP, as a
// suspended laptop or a migrating VM) for longer than its session lease
// finds its session expired when it continues. The meta service must
// survive the renewal of the unknown session, and the mount must open a
// new session and work again: its files, the one it held open included,
// read and write as before.
func TestFailureSessionExpiresWhileStopped(t *testing.T) {
	const lease = 2 * time.Second
	c := newFailCluster(t, 1, []string{"--session-lease", lease.String()}, nil)
	mnt, m := c.mountProc()

	before := pattern("before", 300<<10)
	if err := os.WriteFile(filepath.Join(mnt, "before"), before, 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(filepath.Join(mnt, "held"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldData := pattern("held", 200<<10)
	if _, err := held.Write(heldData); err != nil {
		t.Fatal(err)
	}
	if err := held.Sync(); err != nil {
		t.Fatal(err)
	}
	// An unlinked file held open lives as long as the session: once it
	// expired, the file may be gone, and reading it must say so.
	ghost, err := os.OpenFile(filepath.Join(mnt, "ghost"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	ghostData := pattern("ghost", 100<<10)
	if _, err := ghost.Write(ghostData); err != nil {
		t.Fatal(err)
	}
	if err := ghost.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "ghost")); err != nil {
		t.Fatal(err)
	}
	ids, err := c.sessionIDs()
	if err != nil || len(ids) != 1 {
		t.Fatalf("sessions before the stop: %v, %v (want the mount's)", ids, err)
	}
	old := ids[0]

	if err := syscall.Kill(-m.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(-m.Pid(), syscall.SIGCONT)
		}
	}()
	c.waitFor("the stopped mount's session to expire", failWait, func() bool {
		ids, err := c.sessionIDs()
		return err == nil && len(ids) == 0
	})
	// Calls made while the mount is stopped wait for it; when it goes on
	// they run, racing with its renewal, and must not fail because the
	// session expired.
	waiting := make(chan error, 2)
	go func() {
		got, err := os.ReadFile(filepath.Join(mnt, "before"))
		if err == nil && !bytes.Equal(got, before) {
			err = fmt.Errorf("read %d bytes, not the %d written", len(got), len(before))
		}
		waiting <- err
	}()
	during := pattern("during", 50<<10)
	go func() { waiting <- os.WriteFile(filepath.Join(mnt, "during"), during, 0o644) }()
	time.Sleep(200 * time.Millisecond) // let both reach the stopped mount
	if err := syscall.Kill(-m.Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	for range 2 {
		select {
		case err := <-waiting:
			if err != nil {
				t.Errorf("a call made while the mount was stopped: %v", err)
			}
		case <-time.After(failWait):
			t.Fatal("calls made while the mount was stopped do not return")
		}
	}

	c.waitFor("the mount's new session", failWait, func() bool {
		ids, err := c.sessionIDs()
		return !c.meta.Running() || (err == nil && len(ids) == 1 && ids[0] != old)
	})
	if !c.meta.Running() {
		t.Fatalf("the meta service exited when the mount came back with its expired session: %v", c.meta.Err())
	}
	if !m.Running() {
		t.Fatalf("the mount exited after its session expired: %v", m.Err())
	}

	got, err := os.ReadFile(filepath.Join(mnt, "before"))
	if err != nil || !bytes.Equal(got, before) {
		t.Fatalf("read back a file written before the stop: %d bytes, %v (want %d bytes, the same)", len(got), err, len(before))
	}
	buf := make([]byte, len(heldData))
	if _, err := held.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, heldData) {
		t.Fatalf("read the file held open across the stop: %v (or different bytes)", err)
	}
	buf = make([]byte, len(ghostData))
	n, err := ghost.ReadAt(buf, 0)
	t.Logf("the unlinked file held open across the expiry reads %d bytes: %v", n, err)
	if err == nil && !bytes.Equal(buf, ghostData) {
		t.Errorf("the unlinked file held open across the expiry reads wrong bytes without an error")
	}
	more := pattern("held-more", 100<<10)
	if _, err := held.WriteAt(more, int64(len(heldData))); err != nil {
		t.Fatalf("write the file held open across the stop: %v", err)
	}
	if err := held.Sync(); err != nil {
		t.Fatalf("fsync the file held open across the stop: %v", err)
	}
	after := pattern("after", 150<<10)
	if err := os.WriteFile(filepath.Join(mnt, "after"), after, 0o644); err != nil {
		t.Fatalf("write a new file after the stop: %v", err)
	}
	got, err = os.ReadFile(filepath.Join(mnt, "after"))
	if err != nil || !bytes.Equal(got, after) {
		t.Fatalf("read back a file written after the stop: %d bytes, %v", len(got), err)
	}
	got, err = os.ReadFile(filepath.Join(mnt, "held"))
	if want := append(append([]byte(nil), heldData...), more...); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back the held file by name: %d bytes, %v (want %d)", len(got), err, len(want))
	}
	if !c.meta.Running() {
		t.Fatalf("the meta service exited: %v", c.meta.Err())
	}
}
