package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// restartMeta stops the meta service with sig (SIGKILL: a crash; SIGTERM:
// a clean stop) and starts it again on the same address and directory
// with extra flags, then waits until it answers.
func (c *failCluster) restartMeta(sig syscall.Signal, extra ...string) {
	c.t.Helper()
	c.meta.Kill(c.t, sig)
	args := append([]string{"meta", "--dir", filepath.Join(c.base, "meta"), "--listen", c.metaAddr,
		"--heartbeat-interval", failHeartbeat.String(), "--failure-timeout", failTimeout.String()}, extra...)
	c.meta = c.start("meta", args...)
	c.waitFor("the restarted meta service", failWait, func() bool {
		_, err := c.status()
		return err == nil || !c.meta.Running()
	})
	if !c.meta.Running() {
		c.t.Fatalf("the meta service exited at its restart: %v", c.meta.Err())
	}
}

// regularFiles counts the regular files in dir (not below).
func regularFiles(t *testing.T, dir string) uint64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, e := range ents {
		if e.Type().IsRegular() {
			n++
		}
	}
	return n
}

// TestFailureGraceSurvivesCleanStop: after a crash of the meta service,
// files unlinked during the grace period are kept until it ends (a
// client may not have replayed its opens yet). A clean stop inside the
// grace period must not make the next start forget them: it has a grace
// period too, then deletes them, so that fsck finds nothing and status
// counts the files that are visible.
func TestFailureGraceSurvivesCleanStop(t *testing.T) {
	c := newFailCluster(t, 1, nil, nil)
	mnt := c.mount()
	const files, unlinked = 30, 12
	for i := range files {
		name := fmt.Sprintf("f%02d", i)
		if err := os.WriteFile(filepath.Join(mnt, name), pattern(name, 10<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	c.restartMeta(syscall.SIGKILL, "--open-grace", "10m")
	st, err := c.status()
	if err != nil || st.GetOpenGraceLeftMs() == 0 {
		t.Fatalf("no grace period after a crash of the meta service (status %v)", err)
	}
	for i := range unlinked {
		if err := os.Remove(filepath.Join(mnt, fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatalf("unlink during the grace period: %v", err)
		}
	}
	visible := regularFiles(t, mnt)
	if visible != files-unlinked {
		t.Fatalf("%d files visible after unlinking %d of %d", visible, unlinked, files)
	}
	if st, err := c.status(); err != nil || st.GetFiles() != files {
		t.Logf("status counts %d files during the grace period (%v); the unlinked ones are kept", st.GetFiles(), err)
	}

	c.restartMeta(syscall.SIGTERM, "--open-grace", "1s")
	for deadline := time.Now().Add(failWait); ; time.Sleep(100 * time.Millisecond) {
		st, err := c.status()
		if err == nil && st.GetFiles() == visible && st.GetOpenGraceLeftMs() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the grace period status counts %d files where %d are visible (%d ms of grace left, %v): the files kept in the grace period were not deleted",
				st.GetFiles(), visible, st.GetOpenGraceLeftMs(), err)
		}
	}
	code, out, errOut := runFsckProcess(t, "--meta", c.metaAddr)
	if code != 0 || !strings.Contains(out, "no problems") {
		t.Fatalf("fsck after the grace period: exit %d\n%s%s", code, out, errOut)
	}
	if got := regularFiles(t, mnt); got != visible {
		t.Errorf("%d files visible at the end, want %d", got, visible)
	}
}
