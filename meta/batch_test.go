package meta

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// batchCall encodes a call for a batch.
func batchCall(t *testing.T, method string, req proto.Message) *weftv1.BatchCall {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return &weftv1.BatchCall{Method: method, Request: b}
}

// batchOutcome decodes a reply into resp, or returns its error as a call
// sent alone would have got it.
func batchOutcome(t *testing.T, r *weftv1.BatchReply, resp proto.Message) error {
	t.Helper()
	if len(r.Status) == 0 {
		if err := proto.Unmarshal(r.Response, resp); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	var st spb.Status
	if err := proto.Unmarshal(r.Status, &st); err != nil {
		t.Fatal(err)
	}
	return fserr.FromStatus(status.FromProto(&st).Err())
}

// TestBatch runs calls of several kinds in one batch: each gets what it
// would have got alone (results, errnos), two exclusive creates of one
// name race as they would alone (one wins), and calls that may not be
// batched or do not decode fail on their own without harming the rest.
func TestBatch(t *testing.T) {
	e := newEnv(t)
	d := e.mkdir(root, rootIno, "d", 0o755)
	e.create(root, d.Ino, "old", 0o644)
	so, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "test"})
	if err != nil {
		t.Fatal(err)
	}
	sess := so.Session
	req := &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{
		batchCall(t, "Create", &weftv1.CreateRequest{Caller: root, Parent: d.Ino, Name: "x", Mode: 0o644, Exclusive: true, Session: sess}),
		batchCall(t, "Create", &weftv1.CreateRequest{Caller: root, Parent: d.Ino, Name: "x", Mode: 0o644, Exclusive: true, Session: sess}),
		batchCall(t, "Lookup", &weftv1.LookupRequest{Caller: root, Parent: d.Ino, Name: "missing"}),
		batchCall(t, "Mkdir", &weftv1.MkdirRequest{Caller: root, Parent: d.Ino, Name: "sub", Mode: 0o755}),
		batchCall(t, "Unlink", &weftv1.RemoveRequest{Caller: carol, Parent: d.Ino, Name: "old"}),
		batchCall(t, "Heartbeat", &weftv1.HeartbeatRequest{}),
		{Method: "Create", Request: []byte{0xff, 0xff, 0xff}},
		batchCall(t, "GetAttr", &weftv1.GetAttrRequest{Ino: d.Ino}),
	}}
	resp, err := e.s.Batch(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Replies) != len(req.Calls) {
		t.Fatalf("%d replies to %d calls", len(resp.Replies), len(req.Calls))
	}
	var c1, c2 weftv1.CreateResponse
	e1, e2 := batchOutcome(t, resp.Replies[0], &c1), batchOutcome(t, resp.Replies[1], &c2)
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("two exclusive creates of one name: errors %v and %v, want exactly one EEXIST", e1, e2)
	}
	if err := errors.Join(e1, e2); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("losing exclusive create: %v, want EEXIST", err)
	}
	won := c1.Attr
	if e1 != nil {
		won = c2.Attr
	}
	if a, err := e.lookup(root, d.Ino, "x"); err != nil || a.Ino != won.Ino || !c1.Created && !c2.Created {
		t.Errorf("lookup of the created file: %v, %v; the batch said ino %d", a, err, won.GetIno())
	}
	if err := batchOutcome(t, resp.Replies[2], new(weftv1.AttrResponse)); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("batched lookup of a missing name: %v, want ENOENT", err)
	}
	var mk weftv1.AttrResponse
	if err := batchOutcome(t, resp.Replies[3], &mk); err != nil || mk.Attr.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		t.Errorf("batched mkdir: %v, %v", mk.Attr, err)
	}
	if err := batchOutcome(t, resp.Replies[4], new(weftv1.RemoveResponse)); !errors.Is(err, syscall.EACCES) {
		t.Errorf("batched unlink by another user: %v, want EACCES", err)
	}
	for i := 5; i <= 6; i++ {
		err := batchOutcome(t, resp.Replies[i], new(weftv1.HeartbeatResponse))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("call %d (%s): %v, want InvalidArgument", i, req.Calls[i].Method, err)
		}
	}
	var ga weftv1.AttrResponse
	// The calls of a batch run concurrently: the getattr sees the
	// directory before or after the mkdir.
	if err := batchOutcome(t, resp.Replies[7], &ga); err != nil || ga.Attr.Ino != d.Ino || ga.Attr.Nlink != 2 && ga.Attr.Nlink != 3 {
		t.Errorf("batched getattr of the directory: %v, %v", ga.Attr, err)
	}

	big := &weftv1.BatchRequest{}
	for range maxBatchCalls + 1 {
		big.Calls = append(big.Calls, batchCall(t, "GetAttr", &weftv1.GetAttrRequest{Ino: rootIno}))
	}
	if _, err := e.s.Batch(e.ctx, big); status.Code(err) != codes.InvalidArgument {
		t.Errorf("batch of %d calls: %v, want InvalidArgument", len(big.Calls), err)
	}
}

// countingEngine is the pebble engine, counting what UpdateAll hands it.
type countingEngine struct {
	*pebblekv.Engine
	mu    sync.Mutex
	sizes []int // transactions per UpdateAll
}

func (c *countingEngine) UpdateAll(ctxs []context.Context, fns []func(kv.Txn) error) []error {
	c.mu.Lock()
	c.sizes = append(c.sizes, len(fns))
	c.mu.Unlock()
	return c.Engine.UpdateAll(ctxs, fns)
}

// TestBatchCommitsTogether checks that the transactions of a batch's
// calls reach the engine together, also when some calls fail before
// their transaction (a bad name) or need none (a lookup).
func TestBatchCommitsTogether(t *testing.T) {
	pe, err := pebblekv.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	eng := &countingEngine{Engine: pe}
	e := &env{t: t, ctx: context.Background(), dir: t.TempDir(), lease: time.Minute, data: startChunkServer(t)}
	s, err := Open(e.ctx, Config{Dir: e.dir, Engine: eng, Cluster: cluster.Config{Logger: quietLogger()}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e.s = s
	d := e.mkdir(root, rootIno, "d", 0o755)
	req := &weftv1.BatchRequest{}
	const creates = 12
	for i := range creates {
		req.Calls = append(req.Calls, batchCall(t, "Mkdir", &weftv1.MkdirRequest{Caller: root, Parent: d.Ino, Name: fmt.Sprint("m", i), Mode: 0o755}))
	}
	req.Calls = append(req.Calls,
		batchCall(t, "Mkdir", &weftv1.MkdirRequest{Caller: root, Parent: d.Ino, Name: "bad/name", Mode: 0o755}),
		batchCall(t, "Lookup", &weftv1.LookupRequest{Caller: root, Parent: d.Ino, Name: "m0"}))
	eng.mu.Lock()
	eng.sizes = nil
	eng.mu.Unlock()
	resp, err := s.Batch(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range creates {
		if err := batchOutcome(t, resp.Replies[i], new(weftv1.AttrResponse)); err != nil {
			t.Fatalf("mkdir %d: %v", i, err)
		}
	}
	if err := batchOutcome(t, resp.Replies[creates], new(weftv1.AttrResponse)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("mkdir of a bad name: %v, want EINVAL", err)
	}
	eng.mu.Lock()
	defer eng.mu.Unlock()
	total := 0
	for _, n := range eng.sizes {
		total += n
	}
	// Each mkdir may also take a transaction to reserve inode numbers,
	// outside the group.
	if total != creates || len(eng.sizes) > 2 {
		t.Errorf("the engine got the batch's %d transactions as %v, want them together", creates, eng.sizes)
	}
}

// TestBatchRequestIDs: the calls of a batch carry their own request ids,
// so a batch sent again (to another meta server, after the first try was
// cut off) applies each call once: the repeated calls are answered
// "already applied" and change nothing, a new call in it is applied.
func TestBatchRequestIDs(t *testing.T) {
	e := newEnv(t)
	now := uint64(time.Now().UnixNano())
	mk := func(name, id string) *weftv1.BatchCall {
		c := batchCall(t, "Mkdir", &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: name, Mode: 0o755})
		c.RequestId = id
		return c
	}
	first := &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{mk("a", fmt.Sprintf("%016x-a", now)), mk("b", fmt.Sprintf("%016x-b", now))}}
	if _, err := e.s.Batch(e.ctx, first); err != nil {
		t.Fatal(err)
	}
	again := &weftv1.BatchRequest{Calls: append(first.Calls, mk("c", fmt.Sprintf("%016x-c", now)))}
	resp, err := e.s.Batch(e.ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"a", "b"} {
		err := batchOutcome(t, resp.Replies[i], new(weftv1.AttrResponse))
		if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), AlreadyAppliedMessage) {
			t.Errorf("mkdir %s sent again: %v, want %q", name, err, AlreadyAppliedMessage)
		}
	}
	if err := batchOutcome(t, resp.Replies[2], new(weftv1.AttrResponse)); err != nil {
		t.Errorf("mkdir c, new in the batch sent again: %v", err)
	}
	if got := e.getattr(rootIno).Nlink; got != 5 {
		t.Errorf("root has %d links after the batches, want 5 (a, b and c made once)", got)
	}
}
