package client

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
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
const maxBatchesInFlight = 1

// maxBatchCalls bounds one batch (the meta service takes 256).
const maxBatchCalls = 128

// batchMethods are the Meta methods that may go in a batch: namespace
// calls that answer at once (no lock waits, no streams, no sessions).
var batchMethods = map[string]bool{
	"Lookup": true, "GetAttr": true, "SetAttr": true, "Create": true, "Mkdir": true, "Unlink": true,
	"Rmdir": true, "Rename": true, "Link": true, "Symlink": true, "Readlink": true, "Open": true,
	"Release": true, "Access": true, "CommitWrite": true, "GetXattr": true, "SetXattr": true,
	"ListXattr": true, "RemoveXattr": true,
}

// batcher gathers the calls of one metaConn into batches.
type batcher struct {
	m *metaConn

	mu       sync.Mutex
	inFlight int           // calls or batches sent and not answered
	queue    []*queuedCall // calls waiting for the next batch
	off      atomic.Bool   // the meta service does not know Batch: send alone
	batches  atomic.Uint64 // batches of several calls sent
	batched  atomic.Uint64 // calls sent in them
}

// queuedCall is a call waiting to go in a batch.
type queuedCall struct {
	ctx    context.Context
	method string // full method name
	name   string // short method name
	args   proto.Message
	reply  proto.Message
	done   chan error // gets the outcome once
}

// invoke sends a call of a batchable method: alone now if nothing is in
// flight, else in the next batch.
func (b *batcher) invoke(ctx context.Context, method, name string, args, reply proto.Message) error {
	b.mu.Lock()
	if b.inFlight < maxBatchesInFlight {
		b.inFlight++
		b.mu.Unlock()
		err := b.m.invokeAlone(ctx, method, args, reply)
		b.finished()
		return err
	}
	q := &queuedCall{ctx: ctx, method: method, name: name, args: args, reply: reply, done: make(chan error, 1)}
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

// finished frees an in-flight slot and sends what queued meanwhile.
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
	b.mu.Unlock()
	// The slot passes to the batch; its sender is not one of its callers,
	// each of which returns as soon as its own answer is in.
	go func() {
		b.send(calls)
		b.finished()
	}()
}

// send sends queued calls: one alone, several as a Batch.
func (b *batcher) send(calls []*queuedCall) {
	live := calls[:0:0]
	for _, q := range calls {
		if q.ctx.Err() == nil {
			live = append(live, q)
		} else {
			q.done <- status.FromContextError(q.ctx.Err()).Err()
		}
	}
	switch {
	case len(live) == 0:
		return
	case len(live) == 1 || b.off.Load():
		b.sendAlone(live)
		return
	}
	multi := b.m.several()
	req := &weftv1.BatchRequest{Calls: make([]*weftv1.BatchCall, len(live))}
	deadline := time.Now().Add(b.m.wait)
	for i, q := range live {
		body, err := proto.Marshal(q.args)
		if err != nil {
			// Cannot happen for generated messages; fail the call alone.
			q.done <- err
			live[i] = nil
			continue
		}
		req.Calls[i] = &weftv1.BatchCall{Method: q.name, Request: body}
		if multi && mutating[q.name] {
			req.Calls[i].RequestId = newRequestID()
		}
		if d, ok := q.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
	}
	live, req.Calls = compact(live, req.Calls)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp := new(weftv1.BatchResponse)
	err := b.m.invokeAlone(ctx, metaMethod+"Batch", req, resp)
	if status.Code(err) == codes.Unimplemented {
		// A meta server older than batches: send everything alone.
		b.off.Store(true)
		b.sendAlone(live)
		return
	}
	if err == nil && len(resp.Replies) != len(live) {
		err = status.Errorf(codes.Internal, "meta service answered %d calls of a batch of %d", len(resp.Replies), len(live))
	}
	if err != nil {
		for _, q := range live {
			q.done <- err
		}
		return
	}
	b.batches.Add(1)
	b.batched.Add(uint64(len(live)))
	for i, q := range live {
		q.done <- b.outcome(q, resp.Replies[i])
	}
}

// sendAlone sends each call on its own, concurrently.
func (b *batcher) sendAlone(calls []*queuedCall) {
	var wg sync.WaitGroup
	for _, q := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.done <- b.m.invokeAlone(q.ctx, q.method, q.args, q.reply)
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

// compact drops the calls that failed before being sent (nil in live).
func compact(live []*queuedCall, calls []*weftv1.BatchCall) ([]*queuedCall, []*weftv1.BatchCall) {
	var l []*queuedCall
	var c []*weftv1.BatchCall
	for i, q := range live {
		if q != nil {
			l, c = append(l, q), append(c, calls[i])
		}
	}
	return l, c
}
