package testcluster

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// mounted is a "weft mount" of the cluster.
type mounted struct {
	dir  string
	args []string
	proc *Proc
}

// Mount runs "weft mount" of the cluster with the extra flags args on a
// new directory in the cluster's directory, waits until it is mounted and
// returns the mount point. It is unmounted when the test ends (SIGTERM,
// which flushes), before the final fsck. Without FUSE the test is
// skipped.
func (c *Cluster) Mount(args ...string) string {
	c.t.Helper()
	NeedFUSE(c.t)
	c.mu.Lock()
	n := len(c.mounts) + 1
	c.mu.Unlock()
	dir := filepath.Join(c.dir, "mnt"+strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	full := append(append([]string{"mount", "--meta", c.MetaAddr()}, args...), dir)
	p := StartProc(c.t, "mount"+strconv.Itoa(n), ProcOptions{Env: []string{"WEFT_RUNTIME_DIR=" + filepath.Join(c.dir, "run")}}, full...)
	m := &mounted{dir: dir, args: args, proc: p}
	c.mu.Lock()
	c.mounts = append(c.mounts, m)
	c.mu.Unlock()
	// Run before StartProc's cleanup, which kills it.
	c.t.Cleanup(func() { c.stopMount(m) })
	deadline := time.Now().Add(time.Minute)
	for !IsMountPoint(dir) {
		if !p.Running() || time.Now().After(deadline) {
			c.t.Fatalf("testcluster: weft mount on %s did not mount (exit: %v):\n%s", dir, p.Err(), p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return dir
}

// MountDir is where the first mount is ("" without one).
func (c *Cluster) MountDir() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.mounts) == 0 {
		return ""
	}
	return c.mounts[0].dir
}

// stopMounts unmounts every mount and returns their flags.
func (c *Cluster) stopMounts() [][]string {
	c.mu.Lock()
	ms := append([]*mounted(nil), c.mounts...)
	c.mu.Unlock()
	var args [][]string
	for _, m := range ms {
		args = append(args, m.args)
		c.stopMount(m)
	}
	return args
}

// stopMount unmounts m (SIGTERM: flushed) and forgets it. A mount that
// will not go away is detached.
func (c *Cluster) stopMount(m *mounted) {
	c.mu.Lock()
	i := slices.Index(c.mounts, m)
	if i >= 0 {
		c.mounts = slices.Delete(c.mounts, i, i+1)
	}
	c.mu.Unlock()
	if i < 0 {
		return
	}
	running := m.proc.Running()
	m.proc.Kill(c.t, syscall.SIGTERM)
	if running && m.proc.Err() != nil {
		c.t.Errorf("testcluster: weft mount on %s stopped with %v:\n%s", m.dir, m.proc.Err(), m.proc.Output())
	}
	if IsMountPoint(m.dir) {
		c.t.Errorf("testcluster: %s still mounted after weft mount stopped; detaching it", m.dir)
		CleanupUnder(m.dir)
	}
}

// MountEntry is a line of /proc/self/mountinfo.
type MountEntry struct {
	Dev    string // major:minor
	Point  string
	FSType string
	Source string
}

// Mounts lists the mounts of this process's mount namespace.
func Mounts() []MountEntry {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []MountEntry
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		// id parent major:minor root point options [optional...] - type source super
		sep := -1
		for i, s := range f {
			if s == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		out = append(out, MountEntry{Dev: f[2], Point: unescapeMount(f[4]), FSType: f[sep+1], Source: unescapeMount(f[sep+2])})
	}
	return out
}

// unescapeMount undoes the octal escapes (\040 ...) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// IsMountPoint reports whether a file system (of any kind) is mounted on
// dir.
func IsMountPoint(dir string) bool {
	for _, m := range Mounts() {
		if m.Point == dir {
			return true
		}
	}
	return false
}
