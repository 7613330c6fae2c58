package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Batches of namespace calls. Each call of the meta service costs a round
// trip and, on both ends, a gRPC dispatch and a few thread wake-ups, which
// is most of what a create or a stat costs. When many callers (the
// processes of an mdtest, a parallel make, an untar) ask at once, their
// calls wait for the one in flight and then go together as one Batch: one
// round trip and one dispatch, and on the meta service one commit group.
// A call made while nothing is in flight goes alone at once, so a single
// caller waits for nothing more than before. The meta service runs the
// calls of a batch concurrently, each as if it had come alone, so batching
// changes no outcome: calls that are in a batch together were all waiting
// at once, and none of them was ordered after another.

// maxBatchesInFlight is how many calls or batches one client has at the
// meta service at once before further calls wait to go in the next batch.
// One was as good as four on the embedded engine (16 processes, private
// and shared directories, within the noise) and 15-50% slower on etcd,
// where each call is several etcd round trips and a batch waits for its
// slowest call.
const maxBatchesInFlight = 4

// maxBatchCalls bounds one batch (the meta service takes 256).
const maxBatchCalls = 128

// batchMethods are the Meta methods that may go in a batch: namespace
// calls that answer at once (no lock waits, no streams, no sessions).
var batchMethods = map[string]bool{
	"Lookup": true, "GetAttr": true, "SetAttr": true, "Create": true, "Mkdir": true, "Unlink": true,
	"Rmdir": true, "Rename": true, "Link": true, "Symlink": true, "Readlink": true, "Open": true,
	"Release": true, "Access": true, "CommitWrite": true, "GetXattr": true, "SetXattr": true,
	"ListXattr": true, "RemoveXattr": true,
	"Delegate": true, "ReturnDelegation": true, "CreateMany": true, "RecordOpens": true,
}

// urgentMethods go at once, without waiting for or taking an in-flight
// slot: the delegation calls (delegate.go), which other calls, here and
// at other clients, may be waiting for.
var urgentMethods = map[string]bool{"Delegate": true, "ReturnDelegation": true, "CreateMany": true, "RecordOpens": true}

// batcher gathers the calls of one metaConn into batches.
type batcher struct {
	m *metaConn

	mu       sync.Mutex
	inFlight int           // calls or batches sent and not answered
	queue    []*queuedCall // calls waiting for the next batch

	off       atomic.Bool                 // the meta service does not know Batch: send alone
	lean      atomic.Pointer[wire.Client] // the meta server's lean path, if it has one
	batches   atomic.Uint64               // batches of several calls sent
	batched   atomic.Uint64               // calls sent in them
	leanCalls atomic.Uint64               // batches (of one call or more) sent on the lean path
}

// queuedCall is a call waiting to go in a batch.
type queuedCall struct {
	ctx    context.Context
	method string // full method name
	name   string // short method name
	args   proto.Message
	reply  proto.Message
	done   chan error // gets the outcome once

	background bool   // nobody waits for it (see backgroundKey)
	reqID      string // its request id once sent with one (several meta servers)
}

// backgroundKey marks the context of a call nobody waits for (the
// release of closed files): sent alone, it does not take the in-flight
// slot, so a waiting caller's call that comes meanwhile goes at once
// instead of waiting behind it; while the slot is taken it goes in the
// next batch like any call.
type backgroundKey struct{}

// withBackground marks ctx as the context of a background call.
func withBackground(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

// invoke sends a call of a batchable method: alone now if nothing is in
// flight (or nobody waits for it), else in the next batch.
func (b *batcher) invoke(ctx context.Context, method, name string, args, reply proto.Message) error {
	if urgentMethods[name] {
		return b.sendNow(ctx, method, name, args, reply)
	}
	background := ctx.Value(backgroundKey{}) != nil
	b.mu.Lock()
	switch {
	case background && (b.inFlight < maxBatchesInFlight || len(b.queue) == 0):
		// No batch to join: at once, without the slot.
		b.mu.Unlock()
		return b.sendNow(ctx, method, name, args, reply)
	case !background && b.inFlight < maxBatchesInFlight:
		b.inFlight++
		b.mu.Unlock()
		err := b.sendNow(ctx, method, name, args, reply)
		b.finished()
		return err
	}
	q := &queuedCall{ctx: ctx, method: method, name: name, args: args, reply: reply, done: make(chan error, 1), background: background}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case err := <-q.done:
		return err
	case <-ctx.Done():
		// The call may still be sent (or be applied already, as a call
		// sent alone may be when its caller gives up); its outcome is
		// dropped.
		return status.FromContextError(ctx.Err()).Err()
	}
}

// sendNow sends one call alone: on the lean path as a batch of one if
// the meta server has one, else over gRPC.
func (b *batcher) sendNow(ctx context.Context, method, name string, args, reply proto.Message) error {
	if w := b.lean.Load(); w != nil {
		return b.sendLean(w, []*queuedCall{{ctx: ctx, method: method, name: name, args: args, reply: reply}}, true)
	}
	return b.m.invokeAlone(ctx, method, args, reply)
}

// finished frees an in-flight slot and sends what queued meanwhile: with
// the slot if a caller waits in it, else (background calls only) without.
func (b *batcher) finished() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	n := min(len(b.queue), maxBatchCalls)
	calls := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	waited := false
	for _, q := range calls {
		waited = waited || !q.background
	}
	if !waited {
		b.inFlight--
	}
	b.mu.Unlock()
	// The slot passes to the batch; its sender is not one of its callers,
	// each of which returns as soon as its own answer is in.
	go func() {
		b.send(calls)
		if waited {
			b.finished()
		}
	}()
}

// send sends queued calls: on the lean path as one batch if the meta
// server has one, else over gRPC.
func (b *batcher) send(calls []*queuedCall) {
	live := calls[:0:0]
	for _, q := range calls {
		if q.ctx.Err() == nil {
			live = append(live, q)
		} else {
			q.done <- status.FromContextError(q.ctx.Err()).Err()
		}
	}
	if len(live) == 0 {
		return
	}
	if w := b.lean.Load(); w != nil {
		b.sendLean(w, live, false)
		return
	}
	b.sendGRPC(live)
}

// request encodes calls as a batch and returns it with the calls that
// went in (those that could not be encoded have their answer) and the
// latest of their deadlines.
func (b *batcher) request(calls []*queuedCall) (*weftv1.BatchRequest, []*queuedCall, time.Time) {
	multi := b.m.several()
	req := &weftv1.BatchRequest{Calls: make([]*weftv1.BatchCall, 0, len(calls))}
	live := calls[:0:0]
	deadline := time.Now().Add(b.m.wait)
	for _, q := range calls {
		body, err := proto.Marshal(q.args)
		if err != nil {
			// Cannot happen for generated messages; fail the call alone.
			q.done <- err
			continue
		}
		call := &weftv1.BatchCall{Method: q.name, Request: body}
		if md, ok := metadata.FromOutgoingContext(q.ctx); ok {
			if v := md.Get(sessionHeader); len(v) > 0 {
				call.Session = v[0] // GetAttr names no session of its own
			}
		}
		if multi && mutating[q.name] {
			if q.reqID == "" {
				q.reqID = newRequestID()
			}
			call.RequestId = q.reqID // the same in every try
		}
		req.Calls = append(req.Calls, call)
		live = append(live, q)
		if d, ok := q.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
	}
	return req, live, deadline
}

// deliver hands each call its answer from resp, or err to all of them.
func (b *batcher) deliver(calls []*queuedCall, resp *weftv1.BatchResponse, err error) {
	if err == nil && len(resp.Replies) != len(calls) {
		err = status.Errorf(codes.Internal, "meta service answered %d calls of a batch of %d", len(resp.Replies), len(calls))
	}
	if err != nil {
		for _, q := range calls {
			q.done <- err
		}
		return
	}
	if len(calls) > 1 {
		b.batches.Add(1)
		b.batched.Add(uint64(len(calls)))
	}
	for i, q := range calls {
		q.done <- b.outcome(q, resp.Replies[i])
	}
}

// sendLean sends calls as one batch over the meta server's lean path.
// What never reached the server goes over gRPC instead, and so does a
// batch cut off in flight when there are several meta servers (its calls
// carry request ids, so none is applied twice); then the lean path rests
// until the next session answer names it again. With wait, the single
// call's outcome is returned instead of sent to its done channel (which
// it does not have).
func (b *batcher) sendLean(w *wire.Client, calls []*queuedCall, wait bool) error {
	if wait {
		calls[0].done = make(chan error, 1)
	}
	req, live, deadline := b.request(calls)
	if len(live) > 0 {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		resp, err := w.Batch(ctx, req)
		cancel()
		b.leanCalls.Add(1)
		if err != nil && (errors.Is(err, wire.ErrNotSent) || status.Code(err) == codes.Unavailable && b.m.several()) {
			if b.lean.CompareAndSwap(w, nil) {
				b.m.log.Warn("the meta server's lean path failed; namespace calls go over gRPC until it is named again",
					"wire", w.Addr(), "err", err)
				w.Close()
			}
			b.sendGRPC(live)
		} else {
			b.deliver(live, resp, err)
		}
	}
	if wait {
		return <-calls[0].done
	}
	return nil
}

// sendGRPC sends calls over gRPC: one alone, several as a Batch.
func (b *batcher) sendGRPC(calls []*queuedCall) {
	if len(calls) == 1 || b.off.Load() {
		b.sendAlone(calls)
		return
	}
	req, live, deadline := b.request(calls)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp := new(weftv1.BatchResponse)
	err := b.m.invokeAlone(ctx, metaMethod+"Batch", req, resp)
	if status.Code(err) == codes.Unimplemented {
		b.off.Store(true)
		b.sendAlone(live)
		return
	}
	b.deliver(live, resp, err)
}

// sendAlone sends each call on its own, concurrently.
func (b *batcher) sendAlone(calls []*queuedCall) {
	var wg sync.WaitGroup
	for _, q := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := q.ctx
			if q.reqID != "" {
				ctx = context.WithValue(ctx, requestIDKey{}, q.reqID)
			}
			q.done <- b.m.invokeAlone(ctx, q.method, q.args, q.reply)
		}()
	}
	wg.Wait()
}

// outcome decodes a call's reply into the caller's reply message, or
// turns it into the error the call would have got alone.
func (b *batcher) outcome(q *queuedCall, r *weftv1.BatchReply) error {
	if len(r.Status) == 0 {
		return proto.Unmarshal(r.Response, q.reply)
	}
	var st spb.Status
	if err := proto.Unmarshal(r.Status, &st); err != nil {
		return status.Errorf(codes.Internal, "decode the error of a batched %s: %v", q.name, err)
	}
	err := status.FromProto(&st).Err()
	if status.Code(err) == codes.Aborted && strings.Contains(err.Error(), alreadyApplied) {
		// Applied by an earlier try of the batch that was cut off.
		return b.m.readBack(q.ctx, q.name, q.args, q.reply)
	}
	return fserr.FromStatus(err)
}
