package perm

import (
	"errors"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestApplySetAttr checks Linux's setattr rules on a file of uid 1000,
// gid 100, mode 06755: who may change what, and what a change clears.
func TestApplySetAttr(t *testing.T) {
	const now = 1e18
	file := &weftv1.Attr{Ino: 7, Mode: syscall.S_IFREG | 0o6755, Uid: 1000, Gid: 100, AtimeNs: 1, MtimeNs: 1, CtimeNs: 1}
	root := Caller{}
	owner := Caller{Uid: 1000, Gid: 100, Groups: []uint32{200}}
	other := Caller{Uid: 2000, Gid: 300}
	writer := Caller{Uid: 2000, Gid: 100} // in the file's group, which may not write (r-x)
	tests := []struct {
		name string
		c    Caller
		req  *weftv1.SetAttrRequest
		want syscall.Errno
		// what the attributes become
		mode, uid, gid uint32
		atime, mtime   int64
	}{
		{"root chowns, setuid and setgid go", root, &weftv1.SetAttrRequest{Valid: SetUID | SetGID, Uid: 5, Gid: 6}, 0, 0o0755, 5, 6, 1, 1},
		{"owner chgrps to its own group", owner, &weftv1.SetAttrRequest{Valid: SetGID, Gid: 200}, 0, 0o0755, 1000, 200, 1, 1},
		{"owner chgrps to another group", owner, &weftv1.SetAttrRequest{Valid: SetGID, Gid: 999}, syscall.EPERM, 0, 0, 0, 0, 0},
		{"owner gives the file away", owner, &weftv1.SetAttrRequest{Valid: SetUID, Uid: 1}, syscall.EPERM, 0, 0, 0, 0, 0},
		{"owner chmods", owner, &weftv1.SetAttrRequest{Valid: SetMode, Mode: 0o2700}, 0, 0o2700, 1000, 100, 1, 1},
		{"another chmods", other, &weftv1.SetAttrRequest{Valid: SetMode, Mode: 0o777}, syscall.EPERM, 0, 0, 0, 0, 0},
		{"root sets setgid outside the group", root, &weftv1.SetAttrRequest{Valid: SetMode, Mode: 0o2755}, 0, 0o2755, 1000, 100, 1, 1},
		{"owner sets explicit times", owner, &weftv1.SetAttrRequest{Valid: SetAtime | SetMtime, AtimeNs: 5, MtimeNs: 9}, 0, 0o6755, 1000, 100, 5, 9},
		{"another sets explicit times", other, &weftv1.SetAttrRequest{Valid: SetMtime, MtimeNs: 9}, syscall.EPERM, 0, 0, 0, 0, 0},
		{"a non-writer touches", writer, &weftv1.SetAttrRequest{Valid: SetMtimeNow}, syscall.EACCES, 0, 0, 0, 0, 0},
		{"owner touches", owner, &weftv1.SetAttrRequest{Valid: SetAtimeNow | SetMtimeNow}, 0, 0o6755, 1000, 100, now, now},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := proto.Clone(file).(*weftv1.Attr)
			err := ApplySetAttr(tt.c, a, tt.req, now, "setattr")
			if tt.want != 0 {
				if !errors.Is(err, tt.want) {
					t.Fatalf("got %v, want %v", err, tt.want)
				}
				if !proto.Equal(a, file) {
					t.Fatalf("a refused change changed the attributes: %v", a)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Mode != syscall.S_IFREG|tt.mode || a.Uid != tt.uid || a.Gid != tt.gid || a.AtimeNs != tt.atime || a.MtimeNs != tt.mtime || a.CtimeNs != now {
				t.Fatalf("got mode %#o uid %d gid %d atime %d mtime %d ctime %d, want %#o %d %d %d %d %d",
					a.Mode&0o7777, a.Uid, a.Gid, a.AtimeNs, a.MtimeNs, a.CtimeNs, tt.mode, tt.uid, tt.gid, tt.atime, tt.mtime, int64(now))
			}
		})
	}
}
