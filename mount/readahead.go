package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultKernelReadAhead is the kernel's read-ahead window that Mount
// sets on its mounts: one FUSE request (maxWrite). The kernel gives every
// FUSE mount 128 KiB, and the FUSE init reply can only lower that; with
// it a sequential reader's data comes in 128 KiB requests, eight per
// MiB, each a round through the client. With 1 MiB a cold 2 GiB dd read
// went from 1.5 to 2.2 GB/s on a tmpfs-backed cluster, the client's CPU
// per MB down by a third (bench/RESULTS.md, "Earlier runs").
const DefaultKernelReadAhead = maxWrite

// bdiDir is where the kernel lists its backing devices (a FUSE mount has
// one of its own, named by the mount's device number).
const bdiDir = "/sys/class/bdi"

// SetKernelReadAhead sets the kernel's read-ahead window of the file
// system mounted at mountpoint to bytes (rounded down to KiB), through
// /sys/class/bdi/MAJOR:MINOR/read_ahead_kb of its device. It needs root
// (the file is root's); the error says so. bytes 0 leaves the window as
// it is.
func SetKernelReadAhead(mountpoint string, bytes uint64) error {
	if bytes == 0 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return fmt.Errorf("set the kernel read-ahead of %s: %w", mountpoint, err)
	}
	path := filepath.Join(bdiDir, fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)), "read_ahead_kb")
	kb := strconv.FormatUint(max(bytes>>10, 4), 10)
	if err := os.WriteFile(path, []byte(kb+"\n"), 0); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("set the kernel read-ahead of %s to %s KiB: %w (writing %s needs root; "+
				"as root: echo %s > %s)", mountpoint, kb, err, path, kb, path)
		}
		return fmt.Errorf("set the kernel read-ahead of %s to %s KiB in %s: %w", mountpoint, kb, path, err)
	}
	return nil
}

// KernelReadAhead returns the kernel's read-ahead window of the file
// system mounted at mountpoint, in bytes.
func KernelReadAhead(mountpoint string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return 0, fmt.Errorf("read the kernel read-ahead of %s: %w", mountpoint, err)
	}
	path := filepath.Join(bdiDir, fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)), "read_ahead_kb")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read the kernel read-ahead of %s: %w", mountpoint, err)
	}
	kb, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read the kernel read-ahead of %s: %s holds %q", mountpoint, path, b)
	}
	return kb << 10, nil
}
