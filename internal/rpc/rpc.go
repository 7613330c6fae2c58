// Package rpc holds the gRPC settings every weft process shares: message
// size limits fit for 64 MiB chunks, keepalives, and the errno
// interceptors of package fserr, a codec that moves chunk data with fewer
// copies (codec.go), GC tuning for bulk-data processes (gc.go) and an
// opt-in pprof endpoint (WEFT_PPROF, pprof.go).
package rpc

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/weft-fs/weft/internal/fserr"
)

// reconnectMaxDelay caps the wait between attempts to reach a server that
// is down.
const reconnectMaxDelay = time.Second

// bulkCodec sends and receives chunk data with fewer copies (codec.go).
var bulkCodec = newCodec()

// MaxMessageBytes bounds one RPC message: a 64 MiB chunk plus headers.
const MaxMessageBytes = 80 << 20

// NewServer returns a gRPC server with weft's limits and interceptors.
func NewServer(extra ...grpc.ServerOption) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.ChainUnaryInterceptor(fserr.UnaryServerInterceptor),
		grpc.ForceServerCodecV2(bulkCodec),
		grpc.InitialWindowSize(8 << 20),
		grpc.InitialConnWindowSize(32 << 20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	return grpc.NewServer(append(opts, extra...)...)
}

// Dial opens a client connection to addr. The connection is lazy: errors
// to reach the server show up on the first call.
func Dial(addr string) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes),
			grpc.ForceCodecV2(bulkCodec)),
		grpc.WithChainUnaryInterceptor(fserr.UnaryClientInterceptor),
		grpc.WithInitialWindowSize(8<<20),
		grpc.WithInitialConnWindowSize(32<<20),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// gRPC's default reconnect backoff grows to two minutes; a weft
		// server that comes back must be reached within about a second.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
			MinConnectTimeout: 2 * time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return cc, nil
}

// WaitReady blocks until cc is connected or ctx ends.
func WaitReady(ctx context.Context, cc *grpc.ClientConn) error {
	cc.Connect()
	for {
		s := cc.GetState()
		if s.String() == "READY" {
			return nil
		}
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("connect to %s: %w", cc.Target(), ctx.Err())
		}
	}
}
