package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// mountRecord is what a weft mount leaves in the runtime directory so that
// commands run on a path inside the mount (weft layout) find its meta
// service.
type mountRecord struct {
	MountPoint string `json:"mount_point"`
	MetaAddr   string `json:"meta_address"`
	PID        int    `json:"pid"`
}

// runtimeDir is where mount records live: /run/weft for root,
// $XDG_RUNTIME_DIR/weft or $TMPDIR/weft-<uid> for a user. $WEFT_RUNTIME_DIR
// overrides it.
func runtimeDir() string {
	if d := os.Getenv("WEFT_RUNTIME_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/run/weft"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "weft")
	}
	return filepath.Join(os.TempDir(), "weft-"+strconv.Itoa(os.Geteuid()))
}

// mountRecordPath names the record of the mount at mountPoint.
func mountRecordPath(mountPoint string) string {
	return filepath.Join(runtimeDir(), url.PathEscape(filepath.Clean(mountPoint))+".json")
}

// writeMountRecord records that mountPoint is a weft mount of metaAddr.
func writeMountRecord(mountPoint, metaAddr string) error {
	if err := os.MkdirAll(runtimeDir(), 0o700); err != nil {
		return fmt.Errorf("record the mount: %w", err)
	}
	b, err := json.Marshal(mountRecord{MountPoint: mountPoint, MetaAddr: metaAddr, PID: os.Getpid()})
	if err != nil {
		return err
	}
	p := mountRecordPath(mountPoint)
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		return fmt.Errorf("record the mount: %w", err)
	}
	return os.Rename(p+".tmp", p)
}

// removeMountRecord deletes the record of mountPoint if this process wrote it.
func removeMountRecord(mountPoint string) {
	rec, err := readMountRecord(mountPoint)
	if err == nil && rec.PID == os.Getpid() {
		os.Remove(mountRecordPath(mountPoint))
	}
}

func readMountRecord(mountPoint string) (mountRecord, error) {
	var rec mountRecord
	b, err := os.ReadFile(mountRecordPath(mountPoint))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("read %s: %w", mountRecordPath(mountPoint), err)
	}
	return rec, nil
}

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	Dev        string // major:minor; for FUSE the minor is the connection id
	MountPoint string
	FSType     string
	Source     string
}

// readMountInfo parses /proc/self/mountinfo.
func readMountInfo() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m, ok := parseMountInfoLine(sc.Text()); ok {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// parseMountInfoLine reads "id parent maj:min root mountpoint opts
// [optional...] - fstype source superopts".
func parseMountInfoLine(line string) (mountInfo, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i, f := range fields {
		if f == "-" && i >= 6 {
			sep = i
			break
		}
	}
	if sep < 0 || len(fields) < sep+3 {
		return mountInfo{}, false
	}
	return mountInfo{
		Dev:        fields[2],
		MountPoint: unescapeMountInfo(fields[4]),
		FSType:     fields[sep+1],
		Source:     unescapeMountInfo(fields[sep+2]),
	}, true
}

// unescapeMountInfo undoes the octal escapes (\040 for a space) of
// /proc/self/mountinfo.
func unescapeMountInfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
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

// isWeftMount reports whether a mount table entry is a weft FUSE mount.
func isWeftMount(m mountInfo) bool {
	return m.FSType == "fuse.weft" || (strings.HasPrefix(m.FSType, "fuse") && m.Source == "weft")
}

// findWeftMount returns the weft mount point holding path (the deepest
// one), or an error saying that path is not on weft.
func findWeftMount(path string) (string, error) {
	mounts, err := readMountInfo()
	if err != nil {
		return "", fmt.Errorf("read the mount table: %w", err)
	}
	var best *mountInfo
	for i := range mounts {
		m := &mounts[i]
		// The deepest mount point holding path wins; among equal ones the
		// last mounted (it hides the others).
		if within(path, m.MountPoint) && (best == nil || len(m.MountPoint) >= len(best.MountPoint)) {
			best = m
		}
	}
	if best == nil || !isWeftMount(*best) {
		return "", errors.New("it is not on a weft mount")
	}
	return best.MountPoint, nil
}

// within reports whether path is mountPoint or below it.
func within(path, mountPoint string) bool {
	if mountPoint == "/" {
		return true
	}
	return path == mountPoint || strings.HasPrefix(path, mountPoint+"/")
}

// lazyUnmount detaches a FUSE mount that cannot be unmounted normally (busy
// or its process is gone): directly as root, with fusermount3 otherwise.
func lazyUnmount(dir string) error {
	if os.Geteuid() == 0 {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		return nil
	}
	for _, prog := range []string{"fusermount3", "fusermount"} {
		if p, err := lookPath(prog); err == nil {
			return runQuiet(p, "-u", "-z", dir)
		}
	}
	return fmt.Errorf("unmount %s: fusermount3 not found", dir)
}
