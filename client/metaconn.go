package client

import (
	"context"
	"time"

	"google.golang.org/grpc"
)

// metaConn is the connection to the meta service as the Client uses it: a
// call waits while the service is unreachable (a restarting `weft meta`)
// instead of failing at once, up to the caller's deadline or, without one,
// wait. Only requests that never left the client wait: one cut off in
// flight fails, so no namespace operation is applied twice.
type metaConn struct {
	cc   *grpc.ClientConn
	wait time.Duration
}

// Invoke implements grpc.ClientConnInterface.
func (m metaConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.wait)
		defer cancel()
	}
	return m.cc.Invoke(ctx, method, args, reply, append(opts, grpc.WaitForReady(true))...)
}

// NewStream implements grpc.ClientConnInterface.
func (m metaConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return m.cc.NewStream(ctx, desc, method, append(opts, grpc.WaitForReady(true))...)
}
