package meta

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/cluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// A directory layout with replicas 2 makes chains of two; files below it
// get them; Status reports them (and warns that the only server holds
// both copies); deletion goes per chain; targets can be removed.
func TestReplicatedLayout(t *testing.T) {
	e := newEnv(t)
	dir := e.mkdir(root, rootIno, "r2", 0o755)
	if _, err := e.s.SetLayout(e.ctx, &weftv1.SetLayoutRequest{Caller: root, Ino: dir.Ino, Layout: &weftv1.Layout{Replicas: 2}}); err != nil {
		t.Fatal(err)
	}
	if n := e.s.cluster.NumChains(); n != 8 {
		t.Fatalf("%d chains after asking for 2 replicas on 4 targets, want 8", n)
	}
	f := e.create(root, dir.Ino, "f", 0o644)
	if l := f.Layout; l.Replicas != 2 || len(l.Chains) != 4 {
		t.Fatalf("layout of a file with 2 replicas: %v", l)
	}
	for _, id := range f.Layout.Chains {
		if id <= 4 {
			t.Errorf("file with 2 replicas placed on chain %d of one replica: %v", id, f.Layout.Chains)
		}
	}

	st, err := e.s.Status(e.ctx, &weftv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.ChainSummaries) != 2 || st.ChainSummaries[1].Replicas != 2 || st.ChainSummaries[1].Healthy != 4 || st.ChainSummaries[0].Healthy != 4 {
		t.Errorf("chain summaries: %v", st.ChainSummaries)
	}
	if len(st.ChainList) != 8 || st.SyncBytesLeft != 0 || st.SyncEtaMs != 0 {
		t.Errorf("status: %d chains listed, %d bytes to sync, eta %d ms", len(st.ChainList), st.SyncBytesLeft, st.SyncEtaMs)
	}
	if w := strings.Join(st.Warnings, "\n"); !strings.Contains(w, "4 chains of 2 replicas keep two copies on one data server") {
		t.Errorf("warnings: %q", st.Warnings)
	}

	if _, err := e.s.SetAttr(e.ctx, &weftv1.SetAttrRequest{Caller: root, Ino: f.Ino, Valid: setSize, Size: 0}); err != nil {
		t.Fatal(err)
	}
	if err := e.unlink(root, dir.Ino, "f"); err != nil {
		t.Fatal(err)
	}
	if n, err := e.s.collectGarbage(e.ctx); err != nil || n != 1 {
		t.Fatalf("GC: %d, %v", n, err)
	}
	if n := e.data.deletedCount(f.Ino); n != 4 {
		t.Errorf("%d deletions for a file on 4 chains of 2 replicas, want one per chain", n)
	}

	resp, err := e.s.RemoveTarget(e.ctx, &weftv1.RemoveTargetRequest{TargetId: 4})
	if err != nil || resp.ChainsChanged != 2 {
		t.Errorf("RemoveTarget(4) = %v, %v; want 2 chains changed", resp, err)
	}
	if _, err := e.s.RemoveTarget(e.ctx, &weftv1.RemoveTargetRequest{TargetId: 40}); errnoOf(t, err) != syscall.ENOENT {
		t.Errorf("RemoveTarget(40): %v", err)
	}
	tab, err := e.s.GetChains(e.ctx, &weftv1.GetChainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var syncing *weftv1.Chain
	for _, c := range tab.Chains {
		for _, m := range c.Members {
			if m.State == "syncing" {
				syncing = c
			}
		}
	}
	if syncing == nil {
		t.Fatalf("no syncing member after RemoveTarget: %v", tab)
	}
	tail := syncing.Members[1]
	_, err = e.s.ReportSynced(e.ctx, &weftv1.ReportSyncedRequest{ServerId: tail.ServerId, TargetId: tail.TargetId, ChainId: syncing.Id, ChainVersion: syncing.Version - 1})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ReportSynced at an old version: %v", err)
	}
	r, err := e.s.ReportSynced(e.ctx, &weftv1.ReportSyncedRequest{ServerId: tail.ServerId, TargetId: tail.TargetId, ChainId: syncing.Id, ChainVersion: syncing.Version})
	if err != nil || r.Chains.Version != tab.Version+1 {
		t.Errorf("ReportSynced: %v, %v", r, err)
	}

	// The chains of two survive a restart; nothing is rebuilt.
	e.reopen()
	if n := e.s.cluster.NumChains(); n != 8 {
		t.Errorf("%d chains after restart, want 8", n)
	}
}

// With a default layout of 3 replicas the width is remembered at start,
// chains are made as targets register, and StatFS reports what files of
// that layout can hold.
func TestDefaultReplicas(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{
		Dir: t.TempDir(), DefaultLayout: &weftv1.Layout{Replicas: 3},
		Logger: quietLogger(), Cluster: cluster.Config{Logger: quietLogger()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "f", Mode: 0o644}); errnoOf(t, err) != syscall.ENOSPC {
		t.Errorf("create without data servers: %v, want ENOSPC", err)
	}
	for i := range 3 {
		_, err := s.RegisterServer(ctx, &weftv1.RegisterServerRequest{
			Uuid: fmt.Sprintf("s%d", i), Address: fmt.Sprintf("127.0.0.1:%d", 1+i),
			Targets: []*weftv1.TargetReport{{Uuid: fmt.Sprintf("t%d", i), Path: "/t", TotalBytes: 3 << 40, FreeBytes: 3 << 39}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := s.cluster.NumChains(); n != 6 {
		t.Errorf("%d chains on 3 targets with 3 replicas by default, want 3 + 3", n)
	}
	a, err := s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "f", Mode: 0o644})
	if err != nil || a.Attr.Layout.Replicas != 3 || len(a.Attr.Layout.Chains) != 3 {
		t.Fatalf("create: %v, %v", a, err)
	}
	st, err := s.StatFS(ctx, &weftv1.StatFSRequest{})
	if err != nil || st.TotalBytes != 3<<40 || st.FreeBytes != 3<<39 {
		t.Errorf("statfs with 3 replicas: %v, %v", st, err)
	}
}
