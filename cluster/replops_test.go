package cluster

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// opServer is a data server over real gRPC that records the truncations
// and deletions it is asked for; it can refuse the next calls for a stale
// chain version.
type opServer struct {
	weftv1.UnimplementedDataServer
	addr string

	mu     sync.Mutex
	calls  []string // "truncate ino size chain@version" / "delete ino chain@version"
	refuse int      // refuse this many next calls as stale
}

func (d *opServer) record(call string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse > 0 {
		d.refuse--
		return status.Error(codes.FailedPrecondition, "stale chain version")
	}
	d.calls = append(d.calls, call)
	return nil
}

func (d *opServer) TruncateFile(_ context.Context, req *weftv1.TruncateFileRequest) (*weftv1.TruncateFileResponse, error) {
	return &weftv1.TruncateFileResponse{}, d.record(fmt.Sprintf("truncate %d %d %d@%d", req.Ino, req.Size, req.ChainId, req.ChainVersion))
}

func (d *opServer) DeleteFile(_ context.Context, req *weftv1.DeleteFileRequest) (*weftv1.DeleteFileResponse, error) {
	return &weftv1.DeleteFileResponse{}, d.record(fmt.Sprintf("delete %d %d@%d", req.Ino, req.ChainId, req.ChainVersion))
}

// take returns and clears the calls recorded.
func (d *opServer) take() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	slices.Sort(d.calls)
	s := strings.Join(d.calls, "; ")
	d.calls = nil
	return s
}

func startOpServer(t *testing.T) *opServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &opServer{addr: lis.Addr().String()}
	srv := rpc.NewServer()
	weftv1.RegisterDataServer(srv, d)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return d
}

// Truncation and deletion of a replicated file go to each chain's head
// only (the data servers pass them down the chain), with the chain's id
// and version; a member that is offline does not stop them.
func TestReplicatedFileOps(t *testing.T) {
	e := &replEnv{env: newEnv(t), reports: make(map[uint64][]*weftv1.TargetReport)}
	var ds []*opServer
	for i := 1; i <= 3; i++ {
		d := startOpServer(t)
		ds = append(ds, d)
		reps := []*weftv1.TargetReport{report(fmt.Sprintf("t%d.1", i), 500*GiB)}
		resp := e.register(fmt.Sprintf("s%d", i), d.addr, reps...)
		e.reports[resp.ServerId] = reps
	}
	e.ensure(2) // chain 4 = [1 2], 5 = [2 3], 6 = [3 1]
	ctx := context.Background()
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 2, Chains: []uint64{4, 5}}
	calls := func() []string {
		out := make([]string, len(ds))
		for i, d := range ds {
			out[i] = d.take()
		}
		return out
	}
	check := func(what string, err error, want ...string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := calls(); !slices.Equal(got, want) {
			t.Errorf("%s: servers got %q, want %q", what, got, want)
		}
	}
	check("truncate", e.m.TruncateFile(ctx, 42, layout, 10), "truncate 42 10 4@1", "truncate 42 10 5@1", "")
	check("delete", e.m.DeleteFile(ctx, 42, layout), "delete 42 4@1", "delete 42 5@1", "")

	// Server 1 misses heartbeats: chain 4's head is now 2.
	e.clock.advance(e.cfg.FailureTimeout + time.Second)
	for _, id := range []uint64{2, 3} {
		e.heartbeat(id, ds[id-1].addr, e.reports[id]...)
	}
	e.m.checkLiveness(ctx)
	check("truncate with server 1 down", e.m.TruncateFile(ctx, 42, layout, 0), "", "truncate 42 0 4@2; truncate 42 0 5@1", "")

	// A head that has not seen the chain's version yet refuses; the
	// manager tries again.
	ds[1].mu.Lock()
	ds[1].refuse = 2
	ds[1].mu.Unlock()
	check("delete refused twice as stale", e.m.DeleteFile(ctx, 42, layout), "", "delete 42 4@2; delete 42 5@1", "")

	// No serving member left: EIO naming the chain.
	e.clock.advance(e.cfg.FailureTimeout + time.Second)
	e.heartbeat(3, ds[2].addr, e.reports[3]...)
	e.m.checkLiveness(ctx)
	err := e.m.TruncateFile(ctx, 42, layout, 0)
	if en, _ := fserr.Errno(err); en != syscall.EIO || !strings.Contains(err.Error(), "chain 4 (2 replicas) has no serving member online") {
		t.Errorf("truncate with chain 4 down: %v", err)
	}
}
