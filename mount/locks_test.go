package mount

import (
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/weft-fs/weft/client"
)

// TestLockConversions: the kernel's OFFSET_MAX end is the client's
// LockToEOF and back (the kernel refuses a reply past OFFSET_MAX).
func TestLockConversions(t *testing.T) {
	tests := []struct {
		kernel fuse.FileLock
		client client.Lock
	}{
		{fuse.FileLock{Typ: 1, Start: 0, End: offsetMax, Pid: 7}, client.Lock{Type: 1, Start: 0, End: client.LockToEOF, Pid: 7}},
		{fuse.FileLock{Typ: 0, Start: 10, End: 19, Pid: 8}, client.Lock{Type: 0, Start: 10, End: 19, Pid: 8}},
	}
	for _, tt := range tests {
		if got := fromKernel(&tt.kernel); got != tt.client {
			t.Errorf("fromKernel(%+v) = %+v, want %+v", tt.kernel, got, tt.client)
		}
		if got := toKernel(tt.client); got != tt.kernel {
			t.Errorf("toKernel(%+v) = %+v, want %+v", tt.client, got, tt.kernel)
		}
	}
}

// TestLockTable: only owners that locked something are looked up at
// close, POSIX and flock apart.
func TestLockTable(t *testing.T) {
	var lt lockTable
	if lt.mayHold(1, 2, false) {
		t.Fatal("empty table holds a lock")
	}
	lt.note(1, 2, false)
	if !lt.mayHold(1, 2, false) || lt.mayHold(1, 2, true) || lt.mayHold(1, 3, false) {
		t.Fatal("note recorded the wrong holder")
	}
	lt.forget(1, 2, false)
	if lt.mayHold(1, 2, false) {
		t.Fatal("forget kept the holder")
	}
}
