package perm

import (
	"errors"
	"syscall"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestCheckRemove checks who may remove an entry: search and write on the
// directory, the sticky rule, and the errors in Linux's order.
func TestCheckRemove(t *testing.T) {
	dir := func(mode uint32) *weftv1.Attr {
		return &weftv1.Attr{Ino: 2, Mode: syscall.S_IFDIR | mode, Uid: 1000, Gid: 100}
	}
	file := &weftv1.Attr{Ino: 7, Mode: syscall.S_IFREG | 0o644, Uid: 2000, Gid: 100}
	owner := Caller{Uid: 1000, Gid: 100}
	fileOwner := Caller{Uid: 2000, Gid: 300}
	other := Caller{Uid: 3000, Gid: 300}
	for _, tt := range []struct {
		name  string
		c     Caller
		dir   *weftv1.Attr
		child *weftv1.Attr
		want  syscall.Errno
	}{
		{"owner of the directory", owner, dir(0o755), file, 0},
		{"another in a world-writable directory", other, dir(0o777), file, 0},
		{"another without write", other, dir(0o755), file, syscall.EACCES},
		{"another without search", other, dir(0o776), file, syscall.EACCES},
		{"no search comes before no such entry", other, dir(0o776), nil, syscall.EACCES},
		{"no such entry comes before no write", other, dir(0o755), nil, syscall.ENOENT},
		{"sticky: another", other, dir(0o1777), file, syscall.EPERM},
		{"sticky: the entry's owner", fileOwner, dir(0o1777), file, 0},
		{"sticky: the directory's owner", owner, dir(0o1777), file, 0},
		{"sticky: root", Caller{}, dir(0o1700), file, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.CheckRemove(tt.dir, tt.child, "unlink")
			switch {
			case tt.want == 0 && err != nil:
				t.Fatalf("got %v, want allowed", err)
			case tt.want != 0 && !errors.Is(err, tt.want):
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}
