package bench

import (
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The timed loops of the workers call the kernel directly (RawSyscall)
// instead of through the Go scheduler's system call hooks, as a C
// benchmark would. With the hooks, every call that blocks longer than
// 20 µs (any metadata operation on a network file system) makes the
// runtime's monitor thread take the processor away and keep polling
// every 20 µs; sixteen metadata workers on two cores then spend about a
// third of the machine in the runtime (measured: 16 Go processes creating
// files 5,400-6,200/s, the same loop in C or with raw calls 8,000-8,900/s,
// on a weft mount). A worker runs one goroutine, so holding its processor
// through a call costs nothing; asynchronous preemption is turned off in
// the workers (workerGODEBUG) so that no signal interrupts a call that
// runs longer than the 10 ms scheduling slice.

// workerGODEBUG is the GODEBUG setting the runner gives its workers.
const workerGODEBUG = "asyncpreemptoff=1"

// workerEnviron returns the environment of a worker: this process's, with
// workerGODEBUG added to any GODEBUG setting already there, and extra.
func workerEnviron(extra []string) []string {
	env := make([]string, 0, len(os.Environ())+len(extra)+1)
	found := false
	for _, kv := range os.Environ() {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			found = true
			if v != "" {
				kv += ","
			}
			kv += workerGODEBUG
		}
		env = append(env, kv)
	}
	if !found {
		env = append(env, "GODEBUG="+workerGODEBUG)
	}
	return append(env, extra...)
}

// cPath is a NUL-terminated path prepared before the timed part.
type cPath []byte

// newCPath returns p as a NUL-terminated byte string.
func newCPath(p string) cPath {
	b := make([]byte, len(p)+1)
	copy(b, p)
	return b
}

// atFDCWD is AT_FDCWD as a system call argument.
var atFDCWD = func() uintptr { fd := int64(unix.AT_FDCWD); return uintptr(fd) }()

// errnoErr turns a system call's errno into an error (nil for 0).
func errnoErr(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// Each wrapper converts its pointers in the argument list of the call
// itself, the form the unsafe.Pointer rules allow.

// rawOpen is open(2).
func rawOpen(p cPath, flags int, mode uint32) (int, error) {
	for {
		fd, _, e := unix.RawSyscall6(unix.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(&p[0])), uintptr(flags), uintptr(mode), 0, 0)
		if e != unix.EINTR {
			return int(fd), errnoErr(e)
		}
	}
}

// rawClose is close(2).
func rawClose(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
	return errnoErr(e)
}

// rawLstat is lstat(2), through statx.
func rawLstat(p cPath, st *unix.Statx_t) error {
	for {
		_, _, e := unix.RawSyscall6(unix.SYS_STATX, atFDCWD, uintptr(unsafe.Pointer(&p[0])), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, uintptr(unsafe.Pointer(st)), 0)
		if e != unix.EINTR {
			return errnoErr(e)
		}
	}
}

// rawUnlink is unlink(2); with dir set, rmdir(2).
func rawUnlink(p cPath, dir bool) error {
	var flags uintptr
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	for {
		_, _, e := unix.RawSyscall(unix.SYS_UNLINKAT, atFDCWD, uintptr(unsafe.Pointer(&p[0])), flags)
		if e != unix.EINTR {
			return errnoErr(e)
		}
	}
}

// rawMkdir is mkdir(2).
func rawMkdir(p cPath, mode uint32) error {
	for {
		_, _, e := unix.RawSyscall(unix.SYS_MKDIRAT, atFDCWD, uintptr(unsafe.Pointer(&p[0])), uintptr(mode))
		if e != unix.EINTR {
			return errnoErr(e)
		}
	}
}

// rawPread is pread(2).
func rawPread(fd int, b []byte, off int64) (int, error) {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_PREAD64, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(off), 0, 0)
		if e != unix.EINTR {
			return int(n), errnoErr(e)
		}
	}
}

// rawPwrite is pwrite(2).
func rawPwrite(fd int, b []byte, off int64) (int, error) {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_PWRITE64, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(off), 0, 0)
		if e != unix.EINTR {
			return int(n), errnoErr(e)
		}
	}
}

// rawRead is read(2).
func rawRead(fd int, b []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e != unix.EINTR {
			return int(n), errnoErr(e)
		}
	}
}
