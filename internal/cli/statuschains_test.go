package cli

import (
	"bytes"
	"strings"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestClusterHealth(t *testing.T) {
	online := &weftv1.ServerStatus{Id: 1, Online: true, Targets: []*weftv1.TargetStatus{{Id: 1, Online: true}}}
	offline := &weftv1.ServerStatus{Id: 2, Targets: []*weftv1.TargetStatus{{Id: 2}}}
	retiredServer := &weftv1.ServerStatus{Id: 3, Targets: []*weftv1.TargetStatus{{Id: 3, Removed: true}}}
	layout := func(r uint32) *weftv1.Layout { return &weftv1.Layout{Replicas: r} }
	tests := []struct {
		name       string
		st         *weftv1.StatusResponse
		wantHealth string
		wantWhy    []string
	}{
		{"healthy", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online},
			ChainSummaries: []*weftv1.ChainSummary{{Replicas: 1, Total: 1, Healthy: 1}}}, healthOK, nil},
		{"no servers", &weftv1.StatusResponse{}, healthWarn, []string{"no data servers registered"}},
		{"offline server", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online, offline}}, healthWarn,
			[]string{"1 of 2 data servers offline"}},
		{"retired server is not offline", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online, retiredServer}}, healthOK, nil},
		{"degraded and syncing", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online}, DefaultLayout: layout(3),
			ChainSummaries: []*weftv1.ChainSummary{{Replicas: 3, Total: 5, Healthy: 3, Degraded: 1, Syncing: 1}}}, healthWarn,
			[]string{"1 chain of 3 replicas degraded", "1 chain of 3 replicas syncing"}},
		{"unavailable replicated chain", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online}, DefaultLayout: layout(2),
			ChainSummaries: []*weftv1.ChainSummary{{Replicas: 2, Total: 2, Unavailable: 2}}}, healthErr,
			[]string{"2 chains of 2 replicas unavailable"}},
		{"unavailable single copy chain, replicas 1 cluster", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online, offline}, DefaultLayout: layout(1),
			ChainSummaries: []*weftv1.ChainSummary{{Replicas: 1, Total: 2, Healthy: 1, Unavailable: 1}}}, healthErr,
			[]string{"1 chain of 1 replica unavailable", "1 of 2 data servers offline"}},
		{"unavailable single copy chain, replicated cluster", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online, offline}, DefaultLayout: layout(2),
			ChainSummaries: []*weftv1.ChainSummary{{Replicas: 1, Total: 2, Healthy: 1, Unavailable: 1}}}, healthWarn,
			[]string{"1 of 2 data servers offline", "1 chain of 1 replica unavailable (files with replicas 1 on offline servers)"}},
		{"warnings", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online}, Warnings: []string{"a", "b"}}, healthWarn,
			[]string{"2 warnings"}},
		{"read-only target", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online,
			{Id: 4, Online: true, Targets: []*weftv1.TargetStatus{{Id: 7, Online: true, FaultKind: "read-only", Fault: "EROFS"}}}}},
			healthWarn, []string{"target 7 on data server 4 read-only"}},
		{"fault of a removed target is not news", &weftv1.StatusResponse{Servers: []*weftv1.ServerStatus{online,
			{Id: 4, Online: true, Targets: []*weftv1.TargetStatus{{Id: 7, Online: true, Removed: true, FaultKind: "failed"}}}}},
			healthOK, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, why := clusterHealth(tt.st)
			if h != tt.wantHealth || strings.Join(why, "; ") != strings.Join(tt.wantWhy, "; ") {
				t.Errorf("clusterHealth = %s %q, want %s %q", h, why, tt.wantHealth, tt.wantWhy)
			}
		})
	}
}

func TestETAString(t *testing.T) {
	tests := []struct {
		ms   int64
		want string
	}{
		{-1, "time left not known yet (no copy rate measured)"},
		{0, "about to finish"},
		{400, "less than a second"},
		{40_400, "about 40s"},
		{200_000, "about 3m20s"},
		{2*3600_000 + 30_000, "about 2h1m0s"},
	}
	for _, tt := range tests {
		if got := etaString(tt.ms); got != tt.want {
			t.Errorf("etaString(%d) = %q, want %q", tt.ms, got, tt.want)
		}
	}
}

func TestChainState(t *testing.T) {
	m := func(state string) *weftv1.ChainMember { return &weftv1.ChainMember{State: state} }
	tests := []struct {
		chain *weftv1.Chain
		want  string
	}{
		{&weftv1.Chain{Replicas: 2, Members: []*weftv1.ChainMember{m("serving"), m("serving")}}, "healthy"},
		{&weftv1.Chain{Replicas: 2, Members: []*weftv1.ChainMember{m("serving")}}, "degraded"},
		{&weftv1.Chain{Replicas: 2, Members: []*weftv1.ChainMember{m("serving"), m("offline")}}, "degraded"},
		{&weftv1.Chain{Replicas: 2, Members: []*weftv1.ChainMember{m("serving"), m("syncing")}}, "syncing"},
		{&weftv1.Chain{Replicas: 2, Members: []*weftv1.ChainMember{m("offline"), m("syncing")}}, "unavailable"},
		{&weftv1.Chain{Members: []*weftv1.ChainMember{m("serving")}}, "healthy"},
	}
	for _, tt := range tests {
		if got := chainState(tt.chain); got != tt.want {
			t.Errorf("chainState(%v) = %q, want %q", tt.chain, got, tt.want)
		}
	}
}

func TestWriteChainHealthSyncing(t *testing.T) {
	st := &weftv1.StatusResponse{
		ChainSummaries: []*weftv1.ChainSummary{{Replicas: 3, Total: 5, Healthy: 4, Syncing: 1}, {Replicas: 4}},
		SyncBytesLeft:  1288490189, SyncEtaMs: 40_000,
		Warnings: []string{"2 chains of 3 replicas keep two copies on one data server"},
	}
	var b bytes.Buffer
	writeChainHealth(&b, st)
	for _, want := range []string{
		"  replicas 3: 4 healthy, 0 degraded, 1 syncing, 0 unavailable\n",
		"  replicas 4: no chains yet (made once 4 targets are in service)\n",
		"  syncing: 1.2 GiB left, about 40s\n",
		"warnings:\n  - 2 chains of 3 replicas keep two copies on one data server\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}
