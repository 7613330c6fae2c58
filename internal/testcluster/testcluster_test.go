package testcluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestStartStopData(t *testing.T) {
	c := Start(t, Options{DataServers: 2, FailureTimeout: 2 * time.Second, KeepDataAddrs: true})
	st := c.Status()
	if len(st.GetServers()) != 2 {
		t.Fatalf("status shows %d servers, want 2", len(st.GetServers()))
	}
	addr := c.DataAddr(1)
	c.StopData(1)
	c.WaitOffline(1)
	c.StartData(1)
	c.WaitOnline(2)
	if got := c.DataAddr(1); got != addr {
		t.Errorf("data server 1 came back on %s, want its old address %s", got, addr)
	}
	if n := len(c.Status().GetServers()); n != 2 {
		t.Errorf("a restarted data server must keep its identity: %d servers registered, want 2", n)
	}
}

func TestMount(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs /dev/fuse and root")
	}
	c := Start(t, Options{DataServers: 2, Layout: &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 2}, Mount: true})
	want := bytes.Repeat([]byte("weft"), 100000)
	p := filepath.Join(c.MountDir(), "f")
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v", err)
	}
}

func TestReplicas(t *testing.T) {
	c := Start(t, Options{DataServers: 2, Layout: &weftv1.Layout{Replicas: 2}, RepairDelay: time.Hour, FailureTimeout: 2 * time.Second})
	st := c.Status()
	var two *weftv1.ChainSummary
	for _, s := range st.GetChainSummaries() {
		if s.GetReplicas() == 2 {
			two = s
		}
	}
	if two == nil || two.GetTotal() == 0 || two.GetHealthy() != two.GetTotal() {
		t.Fatalf("after Start with Replicas 2: chain summaries %v, want healthy chains of 2 replicas", st.GetChainSummaries())
	}
	if _, err := c.DataServer(0).Scrub(context.Background()); err != nil {
		t.Fatalf("scrub: %v", err)
	}
	c.StopData(1)
	if c.DataServer(1) != nil {
		t.Error("DataServer of a stopped server must be nil")
	}
	c.WaitStatus("a degraded chain", func(st *weftv1.StatusResponse) bool {
		for _, s := range st.GetChainSummaries() {
			if s.GetReplicas() == 2 && s.GetDegraded() > 0 {
				return true
			}
		}
		return false
	})
	c.StartData(1)
	c.WaitHealthy()
}

// TestEngines starts a cluster on each metadata engine, makes a directory
// and a file through the meta service, restarts the meta service and
// finds them again; the fsck at the end must find nothing.
func TestEngines(t *testing.T) {
	for _, engine := range Engines {
		t.Run(engine, func(t *testing.T) {
			c := Start(t, Options{DataServers: 1, Engine: engine})
			ctx := context.Background()
			caller := &weftv1.Caller{}
			d, err := c.Meta().Mkdir(ctx, &weftv1.MkdirRequest{Caller: caller, Parent: 1, Name: "d", Mode: 0o755})
			if err != nil {
				t.Fatalf("mkdir: %v", err)
			}
			c.StopMeta()
			c.StartMeta()
			got, err := c.Meta().Lookup(ctx, &weftv1.LookupRequest{Caller: caller, Parent: 1, Name: "d"})
			if err != nil || got.GetAttr().GetIno() != d.GetAttr().GetIno() {
				t.Fatalf("lookup after a restart of the meta service: %v, %v; want inode %d", got, err, d.GetAttr().GetIno())
			}
			if r := c.Fsck(false); len(r.GetProblems()) != 0 {
				t.Errorf("fsck: %s", DescribeFsck(r))
			}
		})
	}
}

// TestProcesses runs a replicated cluster as weft processes on each
// engine, mounted: a data server killed with SIGKILL mid-way loses
// nothing, and comes back in sync.
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts weft processes")
	}
	for _, engine := range Engines {
		t.Run(engine, func(t *testing.T) {
			c := Start(t, Options{Processes: true, Engine: engine, DataServers: 2, Mount: true,
				Layout: &weftv1.Layout{Replicas: 2, ChunkSize: 64 << 10}, FailureTimeout: 2 * time.Second})
			if c.Meta() != nil || c.Proc("data1") == nil {
				t.Fatal("servers of Processes must run as processes")
			}
			a := bytes.Repeat([]byte("before"), 50000)
			b := bytes.Repeat([]byte("after"), 50000)
			if err := os.WriteFile(filepath.Join(c.MountDir(), "a"), a, 0o644); err != nil {
				t.Fatal(err)
			}
			c.KillData(1, syscall.SIGKILL)
			if err := os.WriteFile(filepath.Join(c.MountDir(), "b"), b, 0o644); err != nil {
				t.Fatalf("write with a replica killed: %v", err)
			}
			c.StartData(1)
			c.WaitHealthy()
			for name, want := range map[string][]byte{"a": a, "b": b} {
				if got, err := os.ReadFile(filepath.Join(c.MountDir(), name)); err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s reads back %d bytes (err %v), want %d", name, len(got), err, len(want))
				}
			}
		})
	}
}
