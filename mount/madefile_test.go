package mount

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/client"
)

// madeEnv is one case of TestMadeFileOperations: directory dir of mount a,
// held under a create delegation, where file name was just made through
// the mount and is still open (f); the same directory seen through mount
// b of the same cluster; and another directory, away, of mount a.
type madeEnv struct {
	t          *testing.T
	ca         *client.Client
	a, b, away string // the directory in mount a, in mount b; another in a
	name       string
	f          *os.File
}

func (e *madeEnv) pa(n string) string { return filepath.Join(e.a, n) }
func (e *madeEnv) pb(n string) string { return filepath.Join(e.b, n) }

// statB stats name of the directory through mount b.
func (e *madeEnv) statB(n string) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(e.pb(n), &st); err != nil {
		return nil, fmt.Errorf("stat %s through the other mount: %w", n, err)
	}
	return &st, nil
}

// wantGoneB checks that name is missing from the directory in mount b.
func (e *madeEnv) wantGoneB(n string) error {
	if _, err := os.Stat(e.pb(n)); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stat %s through the other mount: %v, want no such file", n, err)
	}
	return nil
}

// TestMadeFileOperations runs every operation that goes to the meta
// service on a file just made under a create delegation and still open,
// both before the file is sent to the meta service (made files wait a
// minute unless something needs them) and after (an fsync of its
// directory sent it), and checks what the other mount of the cluster
// sees then. Every one must find the file the moment its create
// returned (SQLite takes a lock on a database file it just made).
func TestMadeFileOperations(t *testing.T) {
	a, b, ca := twoMountsWithDirConfig(t, client.Config{Testing: client.Testing{CreateSendDelay: time.Minute}})
	stamp := time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)
	for _, tt := range []struct {
		name  string
		op    func(e *madeEnv) error // through mount a
		check func(e *madeEnv) error // afterwards, mostly through mount b
	}{
		{"flock",
			func(e *madeEnv) error { return unix.Flock(int(e.f.Fd()), unix.LOCK_EX|unix.LOCK_NB) },
			func(e *madeEnv) error {
				g, err := os.Open(e.pb(e.name))
				if err != nil {
					return err
				}
				defer g.Close()
				if err := unix.Flock(int(g.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
					return fmt.Errorf("flock through the other mount: %v, want EWOULDBLOCK", err)
				}
				return unix.Flock(int(e.f.Fd()), unix.LOCK_UN)
			}},
		{"posix lock",
			func(e *madeEnv) error {
				return unix.FcntlFlock(e.f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 100})
			},
			func(e *madeEnv) error {
				g, err := os.OpenFile(e.pb(e.name), os.O_RDWR, 0)
				if err != nil {
					return err
				}
				defer g.Close()
				lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 10, Len: 1}
				if err := unix.FcntlFlock(g.Fd(), unix.F_SETLK, &lk); err != unix.EAGAIN && err != unix.EACCES {
					return fmt.Errorf("conflicting lock through the other mount: %v, want EAGAIN", err)
				}
				return unix.FcntlFlock(e.f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_UNLCK, Len: 100})
			}},
		{"getxattr of none",
			func(e *madeEnv) error {
				if _, err := unix.Getxattr(e.pa(e.name), "user.none", make([]byte, 16)); err != unix.ENODATA {
					return fmt.Errorf("getxattr: %v, want ENODATA", err)
				}
				return nil
			},
			func(e *madeEnv) error { _, err := e.statB(e.name); return err }},
		{"setxattr getxattr",
			func(e *madeEnv) error { return unix.Setxattr(e.pa(e.name), "user.k", []byte("v"), 0) },
			func(e *madeEnv) error {
				for _, p := range []string{e.pa(e.name), e.pb(e.name)} {
					buf := make([]byte, 16)
					if n, err := unix.Getxattr(p, "user.k", buf); err != nil || string(buf[:n]) != "v" {
						return fmt.Errorf("getxattr %s: %q, %v; want v", p, buf[:max(n, 0)], err)
					}
				}
				return nil
			}},
		{"listxattr",
			func(e *madeEnv) error {
				if err := unix.Setxattr(e.pa(e.name), "user.listed", []byte("1"), 0); err != nil {
					return err
				}
				return wantXattrs(e.pa(e.name), "user.listed")
			},
			func(e *madeEnv) error { return wantXattrs(e.pb(e.name), "user.listed") }},
		{"removexattr",
			func(e *madeEnv) error {
				if err := unix.Setxattr(e.pa(e.name), "user.gone", []byte("1"), 0); err != nil {
					return err
				}
				return unix.Removexattr(e.pa(e.name), "user.gone")
			},
			func(e *madeEnv) error { return wantXattrs(e.pb(e.name)) }},
		{"chmod",
			func(e *madeEnv) error { return e.f.Chmod(0o600) },
			func(e *madeEnv) error {
				return wantStatB(e, func(st *syscall.Stat_t) bool { return st.Mode&0o7777 == 0o600 })
			}},
		{"chown",
			func(e *madeEnv) error { return os.Chown(e.pa(e.name), 1234, 5678) },
			func(e *madeEnv) error {
				return wantStatB(e, func(st *syscall.Stat_t) bool { return st.Uid == 1234 && st.Gid == 5678 })
			}},
		{"truncate",
			func(e *madeEnv) error { return e.f.Truncate(100) },
			func(e *madeEnv) error { return wantStatB(e, func(st *syscall.Stat_t) bool { return st.Size == 100 }) }},
		{"utimes",
			func(e *madeEnv) error { return os.Chtimes(e.pa(e.name), stamp, stamp) },
			func(e *madeEnv) error {
				return wantStatB(e, func(st *syscall.Stat_t) bool { return st.Mtim.Nano() == stamp.UnixNano() })
			}},
		{"link",
			func(e *madeEnv) error { return os.Link(e.pa(e.name), e.pa("linked")) },
			func(e *madeEnv) error {
				st, err := e.statB("linked")
				if err == nil && st.Nlink != 2 {
					err = fmt.Errorf("the link shows %d links through the other mount, want 2", st.Nlink)
				}
				return err
			}},
		{"rename in the directory",
			func(e *madeEnv) error { return os.Rename(e.pa(e.name), e.pa("renamed")) },
			func(e *madeEnv) error {
				if _, err := e.statB("renamed"); err != nil {
					return err
				}
				return e.wantGoneB(e.name)
			}},
		{"rename to another directory",
			func(e *madeEnv) error { return os.Rename(e.pa(e.name), filepath.Join(e.away, e.name)) },
			func(e *madeEnv) error {
				if _, err := os.Stat(filepath.Join(e.b, "..", filepath.Base(e.away), e.name)); err != nil {
					return fmt.Errorf("the moved file through the other mount: %w", err)
				}
				return e.wantGoneB(e.name)
			}},
		{"unlink of the open file",
			func(e *madeEnv) error {
				if err := os.Remove(e.pa(e.name)); err != nil {
					return err
				}
				// The open file keeps its data.
				if _, err := e.f.WriteAt([]byte("still here"), 0); err != nil {
					return fmt.Errorf("write after the unlink: %w", err)
				}
				if err := e.f.Sync(); err != nil {
					return fmt.Errorf("fsync after the unlink: %w", err)
				}
				buf := make([]byte, 10)
				if _, err := e.f.ReadAt(buf, 0); err != nil || string(buf) != "still here" {
					return fmt.Errorf("read after the unlink: %q, %v", buf, err)
				}
				return nil
			},
			func(e *madeEnv) error { return e.wantGoneB(e.name) }},
		{"rmdir of the parent after unlink",
			func(e *madeEnv) error {
				ents, err := os.ReadDir(e.a)
				if err != nil {
					return err
				}
				for _, ent := range ents {
					if err := os.Remove(e.pa(ent.Name())); err != nil {
						return err
					}
				}
				if err := e.f.Close(); err != nil {
					return err
				}
				return os.Remove(e.a)
			},
			func(e *madeEnv) error {
				if _, err := os.Stat(e.b); !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("the removed directory through the other mount: %v, want no such file", err)
				}
				return nil
			}},
		{"open again here",
			func(e *madeEnv) error {
				g, err := os.OpenFile(e.pa(e.name), os.O_RDWR, 0)
				if err != nil {
					return err
				}
				defer g.Close()
				if _, err := g.WriteString("again"); err != nil {
					return err
				}
				return g.Close()
			},
			func(e *madeEnv) error {
				if got, err := os.ReadFile(e.pb(e.name)); err != nil || string(got) != "again" {
					return fmt.Errorf("read through the other mount: %q, %v; want again", got, err)
				}
				return nil
			}},
		{"open, stat and read from the other mount",
			func(e *madeEnv) error { return nil },
			func(e *madeEnv) error {
				if err := wantStatB(e, func(st *syscall.Stat_t) bool { return st.Size == 0 && st.Mode&0o777 == 0o640 }); err != nil {
					return err
				}
				if got, err := os.ReadFile(e.pb(e.name)); err != nil || len(got) != 0 {
					return fmt.Errorf("read through the other mount: %q, %v; want an empty file", got, err)
				}
				if err := os.WriteFile(e.pb(e.name), []byte("from b"), 0); err != nil {
					return fmt.Errorf("write through the other mount: %w", err)
				}
				if got, err := os.ReadFile(e.pa(e.name)); err != nil || string(got) != "from b" {
					return fmt.Errorf("read back here what the other mount wrote: %q, %v", got, err)
				}
				return nil
			}},
		{"fsync of the directory",
			func(e *madeEnv) error {
				if err := syncDir(e.a); err != nil {
					return err
				}
				if n := e.ca.PendingCreates(); n != 0 {
					return fmt.Errorf("%d files made here not sent after an fsync of their directory", n)
				}
				return nil
			},
			func(e *madeEnv) error { _, err := e.statB(e.name); return err }},
	} {
		for _, sent := range []bool{false, true} {
			phase := "before it is sent"
			if sent {
				phase = "after it is sent"
			}
			t.Run(tt.name+" "+phase, func(t *testing.T) {
				e := newMadeEnv(t, a, b, ca, sent)
				defer e.f.Close()
				if err := tt.op(e); err != nil {
					t.Fatalf("%s: %v", tt.name, err)
				}
				if err := tt.check(e); err != nil {
					t.Fatalf("after %s: %v", tt.name, err)
				}
			})
		}
	}
}

// newMadeEnv makes a directory of its own for a case through mount a
// (under /d), has ca hold it under a delegation, and makes the case's file
// there, open; with sent, the file is then sent (fsync of the directory).
func newMadeEnv(t *testing.T, a, b string, ca *client.Client, sent bool) *madeEnv {
	t.Helper()
	sub := filepath.Base(t.Name())
	e := &madeEnv{t: t, ca: ca, a: filepath.Join(a, "d", sub), b: filepath.Join(b, "d", sub),
		away: filepath.Join(a, "d", sub+"-away"), name: "made"}
	for _, d := range []string{e.a, e.away} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	waitDelegated(t, ca, e.a)
	if err := syncDir(e.a); err != nil {
		t.Fatal(err)
	}
	_, made := ca.Delegations()
	f, err := os.OpenFile(e.pa(e.name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	e.f = f
	if _, now := ca.Delegations(); now == made {
		t.Fatal("the case's file was not made under the delegation")
	}
	if sent {
		if err := syncDir(e.a); err != nil {
			t.Fatal(err)
		}
	}
	if n := ca.PendingCreates(); (n == 0) != sent {
		t.Fatalf("%d files made here not sent yet (sent: %v)", n, sent)
	}
	return e
}

// syncDir fsyncs directory d.
func syncDir(d string) error {
	f, err := os.Open(d)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync of directory %s: %w", d, err)
	}
	return nil
}

// wantXattrs checks that file p's user extended attributes are want.
func wantXattrs(p string, want ...string) error {
	buf := make([]byte, 4096)
	n, err := unix.Listxattr(p, buf)
	if err != nil {
		return fmt.Errorf("listxattr %s: %w", p, err)
	}
	var got []string
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if bytes.HasPrefix(name, []byte("user.")) {
			got = append(got, string(name))
		}
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("listxattr %s: %q, want %q", p, got, want)
	}
	return nil
}

// wantStatB checks the case's file through mount b with ok.
func wantStatB(e *madeEnv, ok func(*syscall.Stat_t) bool) error {
	st, err := e.statB(e.name)
	if err != nil {
		return err
	}
	if !ok(st) {
		return fmt.Errorf("the other mount shows mode %#o, uid %d, gid %d, size %d, mtime %d: not what was set",
			st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Nano())
	}
	return nil
}
