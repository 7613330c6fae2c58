package data

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/weft-fs/weft/data/chunk"
)

// TestFaultKindOf: the errors of a target's disk that mark it, and those
// that do not (a bad copy is repaired, not a disk fault).
func TestFaultKindOf(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{&fs.PathError{Op: "open", Path: "/t/chunks/01/1/0.w", Err: syscall.EROFS}, faultReadOnly},
		{fmt.Errorf("sync chunk 0 of inode 1 on target /t: %w", &fs.PathError{Op: "fdatasync", Err: syscall.EIO}), faultFailed},
		{fmt.Errorf("write: target /t is full (0 B free): %w", syscall.ENOSPC), faultFull},
		{syscall.EDQUOT, faultFull},
		{&chunk.CorruptionError{Target: "/t", Block: 3}, ""}, // wraps EIO, but a bad copy
		{syscall.EINVAL, ""},
		{errors.New("chunk 0 of inode 1: offset past the chunk"), ""},
	} {
		if got := faultKindOf(tt.err); got != tt.want {
			t.Errorf("faultKindOf(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
