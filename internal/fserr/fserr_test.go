package fserr

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name      string
		err       error
		wantCode  codes.Code
		wantErrno syscall.Errno // 0: none carried
	}{
		{"nil", nil, codes.OK, 0},
		{"plain errno", syscall.ENOENT, codes.NotFound, syscall.ENOENT},
		{"wrapped errno", Wrap(syscall.ENOTEMPTY, "rmdir %q", "d"), codes.AlreadyExists, syscall.ENOTEMPTY},
		{"double wrapped", fmt.Errorf("outer: %w", Wrap(syscall.ENAMETOOLONG, "create")), codes.FailedPrecondition, syscall.ENAMETOOLONG},
		{"eio", fmt.Errorf("read chunk: %w", syscall.EIO), codes.DataLoss, syscall.EIO},
		{"enospc", syscall.ENOSPC, codes.ResourceExhausted, syscall.ENOSPC},
		{"canceled", context.Canceled, codes.Canceled, 0},
		{"deadline", fmt.Errorf("call: %w", context.DeadlineExceeded), codes.DeadlineExceeded, 0},
		{"other", errors.New("boom"), codes.Internal, 0},
		{"status kept", status.Error(codes.Unavailable, "down"), codes.Unavailable, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			wire := ToStatus(c.err)
			if got := status.Code(wire); got != c.wantCode {
				t.Errorf("code = %v, want %v", got, c.wantCode)
			}
			back := FromStatus(wire)
			if c.err == nil {
				if back != nil {
					t.Errorf("FromStatus(nil) = %v", back)
				}
				return
			}
			e, ok := Errno(back)
			if c.wantErrno == 0 {
				if ok {
					t.Errorf("errno %v carried, want none", e)
				}
				return
			}
			if !ok || e != c.wantErrno || !errors.Is(back, c.wantErrno) {
				t.Errorf("errno = %v (%v), want %v; err %v", e, ok, c.wantErrno, back)
			}
			if back.Error() != c.err.Error() {
				t.Errorf("message = %q, want %q", back.Error(), c.err.Error())
			}
		})
	}
}
