package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestTargetFaults: a target reported read-only, failed or full, or too
// small to hold a file, gets no new files (single-copy and replicated),
// is named in a status warning with its server and the reason, and a
// read-only or failed one leaves its replicated chains (it comes back
// syncing once reported healthy).
func TestTargetFaults(t *testing.T) {
	for _, tt := range []struct {
		name   string
		fault  func(r *weftv1.TargetReport)
		want   string // in the warning
		leaves bool   // leaves its replicated chains
	}{
		{"read-only", func(r *weftv1.TargetReport) {
			r.FaultKind, r.Fault, r.FaultSinceMs = "read-only", "create chunk: read-only file system", 1
		}, "its disk is read-only", true},
		{"failed", func(r *weftv1.TargetReport) {
			r.FaultKind, r.Fault = "failed", "fdatasync: input/output error"
		}, "its disk failed", true},
		{"full", func(r *weftv1.TargetReport) {
			r.FaultKind, r.Fault = "full", "no space left on device"
		}, "is full", false},
		{"full by capacity", func(r *weftv1.TargetReport) { r.FreeBytes = 10 << 20 }, "is full", false},
		{"too small", func(r *weftv1.TargetReport) { r.TotalBytes, r.FreeBytes = 32<<20, 32<<20 }, "too small", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newReplEnv(t, node{targets: 1}, node{targets: 1}, node{targets: 1})
			e.ensure(2)
			e.use(2)
			e.tick(0, 1, 2, 3)
			tt.fault(e.reports[3][0])
			e.tick(0, 1, 2, 3)

			for range 6 {
				ids, err := e.m.PickChains(context.Background(), 1, 1)
				if err != nil {
					t.Fatal(err)
				}
				if ids[0] == 3 {
					t.Fatalf("a new single-copy file was placed on the chain of the faulty target")
				}
				ids, err = e.m.PickChains(context.Background(), 3, 2)
				if err != nil {
					t.Fatal(err)
				}
				for _, id := range ids {
					for _, m := range e.m.chains[id].Members {
						if m.TargetID == 3 && m.State != stateOffline {
							t.Fatalf("a new replicated file was placed on chain %d with the faulty target serving in it", id)
						}
					}
				}
			}

			h := e.m.Health()
			warned := false
			for _, w := range h.Warnings {
				if strings.Contains(w, "target 3 (/srv/t3.1) on data server 3") && strings.Contains(w, tt.want) {
					warned = true
				}
			}
			if !warned {
				t.Errorf("no warning names target 3, its server and %q: %q", tt.want, h.Warnings)
			}
			var st *weftv1.TargetStatus
			for _, s := range e.m.Servers() {
				for _, ts := range s.Targets {
					if ts.Id == 3 {
						st = ts
					}
				}
			}
			if st.GetFaultKind() == "" || st.GetFault() == "" {
				t.Errorf("status of target 3 shows no fault: %v", st)
			}

			left := false
			for _, c := range e.chainsOf(2) {
				for _, m := range c.Members {
					if m.TargetID == 3 && m.State == stateOffline {
						left = true
					}
				}
			}
			if left != tt.leaves {
				t.Errorf("target 3 offline in a replicated chain: %v, want %v (%s)", left, tt.leaves, chainList(e))
			}
			if !tt.leaves {
				return
			}
			// Healthy again: it comes back syncing.
			e.reports[3][0].FaultKind, e.reports[3][0].Fault = "", ""
			e.tick(0, 1, 2, 3)
			for _, c := range e.chainsOf(2) {
				for _, m := range c.Members {
					if m.TargetID == 3 && m.State != stateSyncing && m.State != stateServing {
						t.Errorf("target 3 is %s in chain %d once healthy again, want syncing", m.State, c.ID)
					}
				}
			}
		})
	}
}

func chainList(e *replEnv) string {
	var parts []string
	for _, c := range e.chainsOf(2) {
		parts = append(parts, fmt.Sprintf("%d:%s", c.ID, e.chain(c.ID)))
	}
	return strings.Join(parts, " ")
}
