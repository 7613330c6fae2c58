package cluster

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// These tests cover what the manager decides before and around the RPCs;
// the RPCs against real data servers are tested with a whole cluster.

func TestFileOpsRefusedWithoutTheData(t *testing.T) {
	e := placementEnv(t, 500*GiB, 500*GiB)
	e.offline(2)
	layout := func(chains ...uint64) *weftv1.Layout {
		return &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: uint32(len(chains)), Replicas: 1, Chains: chains}
	}
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		layout *weftv1.Layout
		want   []string // in the error message
	}{
		{"offline server", layout(1, 2), []string{"data server 2 (h:2) holding chain 2 is offline", "retry when it is back"}},
		{"unknown chain", layout(9), []string{"chain 9 is not in the chain table"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for op, err := range map[string]error{
				"TruncateFile": e.m.TruncateFile(ctx, 42, c.layout, 0),
				"DeleteFile":   e.m.DeleteFile(ctx, 42, c.layout),
			} {
				if !errors.Is(err, syscall.EIO) {
					t.Errorf("%s: %v, want an error wrapping EIO", op, err)
					continue
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not say %q", op, err, w)
					}
				}
			}
		})
	}
	for _, l := range []*weftv1.Layout{nil, {ChunkSize: 1 << 20}} {
		if err := e.m.TruncateFile(ctx, 42, l, 0); err != nil {
			t.Errorf("TruncateFile of a file without chains: %v", err)
		}
		if err := e.m.DeleteFile(ctx, 42, l); err != nil {
			t.Errorf("DeleteFile of a file without chains: %v", err)
		}
	}
}

// TestFileOpsUnreachableServer registers a server at an address where
// nothing listens: the manager retries until the failure timeout could
// have caught it, then fails with EIO.
func TestFileOpsUnreachableServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	e := newEnvTimeouts(t, 20*time.Millisecond, 100*time.Millisecond)
	e.register("s1", addr, report("t1", 500*GiB))
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1, Chains: []uint64{1}}

	ctx := context.Background()
	start := time.Now()
	err = e.m.TruncateFile(ctx, 42, layout, 10)
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("TruncateFile: %v, want EIO saying the server is unreachable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("TruncateFile took %v to give up", d)
	}
	if err := e.m.DeleteFile(ctx, 42, layout); !errors.Is(err, syscall.EIO) {
		t.Errorf("DeleteFile: %v, want EIO", err)
	}
}

func TestDataConnCache(t *testing.T) {
	e := newEnv(t)
	c1, err := e.m.dataClient(1, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	cc1 := e.m.conns[1].cc
	if c, _ := e.m.dataClient(1, "127.0.0.1:1"); c != c1 || e.m.conns[1].cc != cc1 {
		t.Errorf("same address: connection not reused")
	}
	if _, err := e.m.dataClient(1, "127.0.0.1:2"); err != nil {
		t.Fatal(err)
	}
	if cc := e.m.conns[1]; cc.cc == cc1 || cc.addr != "127.0.0.1:2" {
		t.Errorf("new address: connection not replaced")
	}
	if s := cc1.GetState().String(); s != "SHUTDOWN" {
		t.Errorf("connection to the old address is %s, want SHUTDOWN", s)
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	if len(e.m.conns) != 0 {
		t.Errorf("Close left %d connections", len(e.m.conns))
	}
	if _, err := e.m.dataClient(1, "127.0.0.1:2"); err == nil {
		t.Errorf("dialing after Close succeeded")
	}
}
