// Package fserr carries POSIX error numbers across gRPC. The meta and data
// services return syscall.Errno values (wrapped with context) for namespace
// and data errors; ToStatus turns them into a gRPC status with a weftv1.Errno
// detail at the server boundary, and FromStatus turns them back on the
// client side. Errors without an errno travel as ordinary gRPC statuses.
package fserr

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// codeOf maps an errno to the closest gRPC code, for callers that only look
// at codes.
func codeOf(e syscall.Errno) codes.Code {
	switch e {
	case syscall.ENOENT, syscall.ENODATA:
		return codes.NotFound
	case syscall.EEXIST, syscall.ENOTEMPTY:
		return codes.AlreadyExists
	case syscall.EACCES, syscall.EPERM:
		return codes.PermissionDenied
	case syscall.ENOSPC, syscall.EDQUOT:
		return codes.ResourceExhausted
	case syscall.EIO:
		return codes.DataLoss
	case syscall.EAGAIN:
		return codes.Unavailable
	default:
		return codes.FailedPrecondition
	}
}

// ToStatus converts err for returning from a gRPC handler. nil stays nil;
// an error wrapping a syscall.Errno gets the errno as a detail; context
// errors keep their gRPC codes; anything else becomes codes.Internal.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		st := status.New(codeOf(e), err.Error())
		if withDetail, derr := st.WithDetails(&weftv1.Errno{Errno: uint32(e)}); derr == nil {
			st = withDetail
		}
		return st.Err()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// Errno extracts the POSIX error number carried by a gRPC error, if any.
func Errno(err error) (syscall.Errno, bool) {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e, true
	}
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if en, ok := d.(*weftv1.Errno); ok {
			return syscall.Errno(en.Errno), true
		}
	}
	return 0, false
}

// FromStatus converts an error returned by a gRPC call into an error that
// wraps the carried syscall.Errno (so errors.Is(err, syscall.ENOENT) works)
// and keeps the server's message. Errors without an errno are returned
// unchanged.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	e, ok := Errno(err)
	if !ok {
		return err
	}
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	return &remoteError{errno: e, msg: msg}
}

type remoteError struct {
	errno syscall.Errno
	msg   string
}

func (r *remoteError) Error() string { return r.msg }
func (r *remoteError) Unwrap() error { return r.errno }

// UnaryServerInterceptor converts every handler error with ToStatus, so
// handlers may return plain wrapped errors.
func UnaryServerInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, ToStatus(err)
}

// UnaryClientInterceptor converts every call's error with FromStatus.
func UnaryClientInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return FromStatus(invoker(ctx, method, req, reply, cc, opts...))
}

// Wrap annotates an errno with the operation and object it concerns:
// Wrap(syscall.ENOENT, "lookup %q in directory %d", name, dir).
func Wrap(e syscall.Errno, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), e)
}
