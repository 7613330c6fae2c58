package meta

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Batches. A client sends the namespace calls its callers make at the
// same time as one Batch (client/batch.go). Each call of a batch runs in
// its own goroutine through the same interceptors and handler as a call
// sent alone, so a batch changes nothing but the cost: one round trip and
// one gRPC dispatch for many calls, whose transactions are handed to the
// engine together (updategroup.go) and commit with one sync.

// maxBatchCalls bounds the calls of one batch.
const maxBatchCalls = 256

// batchable lists the methods a batch may carry: namespace calls that
// answer at once. Lock waits, sessions, the cluster manager's calls and
// streams are sent alone.
var batchable = func() map[string]grpc.MethodDesc {
	names := []string{"Lookup", "GetAttr", "SetAttr", "Create", "Mkdir", "Unlink", "Rmdir", "Rename",
		"Link", "Symlink", "Readlink", "Open", "Release", "Access", "CommitWrite", "GetXattr", "SetXattr",
		"ListXattr", "RemoveXattr", "Delegate", "ReturnDelegation", "CreateMany", "RecordOpens"}
	all := make(map[string]grpc.MethodDesc)
	for _, m := range weftv1.Meta_ServiceDesc.Methods {
		all[m.MethodName] = m
	}
	out := make(map[string]grpc.MethodDesc, len(names))
	for _, n := range names {
		m, ok := all[n]
		if !ok {
			panic("meta: batchable method " + n + " is not a Meta method")
		}
		out[n] = m
	}
	return out
}()

// quickMethods are the batchable calls that answer at once on the
// embedded engine: reads of the namespace, which wait for nothing but a
// recall of a delegation (and say so: wire.WillBlock).
var quickMethods = map[string]bool{"Lookup": true, "GetAttr": true, "Readlink": true, "Access": true,
	"GetXattr": true, "ListXattr": true}

// QuickBatch reports whether every call of req is one that answers at
// once (wire.QuickBatcher): the lean path then serves it on the goroutine
// that read it. Never on an engine that commits over the network (etcd).
func (s *Service) QuickBatch(req *weftv1.BatchRequest) bool {
	if s.epoch == "" {
		return false
	}
	for _, c := range req.Calls {
		if !quickMethods[c.Method] {
			return false
		}
	}
	return len(req.Calls) > 0
}

// Batch runs the calls of a batch concurrently and answers each.
func (s *Service) Batch(ctx context.Context, req *weftv1.BatchRequest) (*weftv1.BatchResponse, error) {
	if len(req.Calls) > maxBatchCalls {
		return nil, status.Errorf(codes.InvalidArgument, "batch of %d calls: at most %d may go in one batch", len(req.Calls), maxBatchCalls)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	resp := &weftv1.BatchResponse{Replies: make([]*weftv1.BatchReply, len(req.Calls))}
	if len(req.Calls) == 1 {
		resp.Replies[0] = s.runBatched(ctx, md, req.Calls[0])
		return resp, nil
	}
	// Hold the calls' transactions for one commit only where the engine
	// commits several together; on etcd each is a round trip of its own,
	// and holding them would only make each wait for the slowest call.
	var g *updateGroup
	if gu, ok := s.eng.(kv.GroupUpdater); ok {
		g = newUpdateGroup(gu, len(req.Calls))
		ctx = context.WithValue(ctx, updateGroupKey{}, g)
	}
	var wg sync.WaitGroup
	for i, call := range req.Calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g != nil {
				defer g.callDone()
			}
			resp.Replies[i] = s.runBatched(ctx, md, call)
		}()
	}
	wg.Wait()
	return resp, nil
}

// runBatched runs one call of a batch as if it had come alone: with the
// batch's metadata and its own request id, through the service's
// interceptors (errors to status, request ids, callbacks), into its
// method's handler.
func (s *Service) runBatched(ctx context.Context, md metadata.MD, call *weftv1.BatchCall) *weftv1.BatchReply {
	m, ok := batchable[call.Method]
	if !ok {
		return batchError(status.Errorf(codes.InvalidArgument, "batch: method %q cannot be batched; send it alone", call.Method))
	}
	callMD := md.Copy()
	callMD.Delete(mdRequestID)
	if call.RequestId != "" {
		callMD.Set(mdRequestID, call.RequestId)
	}
	if call.Session != "" {
		callMD.Set(SessionHeader, call.Session)
	}
	ctx = metadata.NewIncomingContext(ctx, callMD)
	dec := func(v any) error {
		if err := proto.Unmarshal(call.Request, v.(proto.Message)); err != nil {
			return status.Errorf(codes.InvalidArgument, "batch: decode the %s request: %v", call.Method, err)
		}
		return nil
	}
	resp, err := m.Handler(s, ctx, dec, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return fserr.UnaryServerInterceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			return s.haInterceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
				return s.recallInterceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
					return s.callbackInterceptor(ctx, req, info, h)
				})
			})
		})
	})
	if err != nil {
		return batchError(err)
	}
	out, err := proto.Marshal(resp.(proto.Message))
	if err != nil {
		return batchError(status.Errorf(codes.Internal, "batch: encode the %s response: %v", call.Method, err))
	}
	return &weftv1.BatchReply{Response: out}
}

// batchError is the reply of a call that failed with err.
func batchError(err error) *weftv1.BatchReply {
	st, err := proto.Marshal(status.Convert(fserr.ToStatus(err)).Proto())
	if err != nil {
		st, _ = proto.Marshal(status.New(codes.Internal, fmt.Sprintf("batch: encode an error: %v", err)).Proto())
	}
	return &weftv1.BatchReply{Status: st}
}
