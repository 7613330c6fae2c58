package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"
)

// placementEnv registers one server per entry of free, each with one
// target (and chain) of 1 TiB with that much free space.
func placementEnv(t *testing.T, free ...uint64) *env {
	t.Helper()
	e := newEnv(t)
	for i, f := range free {
		e.register(fmt.Sprintf("s%d", i+1), fmt.Sprintf("h:%d", i+1), report(fmt.Sprintf("t%d", i+1), f))
	}
	return e
}

// offline lets the servers with the given ids miss heartbeats until they
// are marked offline; the others keep heartbeating.
func (e *env) offline(ids ...uint64) {
	e.t.Helper()
	down := make(map[uint64]bool)
	for _, id := range ids {
		down[id] = true
	}
	e.clock.advance(e.cfg.FailureTimeout + time.Second)
	for _, s := range e.m.Servers() {
		if !down[s.Id] {
			e.heartbeat(s.Id, s.Address, report(fmt.Sprintf("t%d", s.Id), s.Targets[0].FreeBytes))
		}
	}
	e.m.checkLiveness(context.Background())
}

func TestPickChains(t *testing.T) {
	const even = 500 * GiB
	for _, c := range []struct {
		name    string
		free    []uint64
		offline []uint64
		n       int
		calls   int
		want    string // the picks of successive calls
		wantErr syscall.Errno
	}{
		{name: "round robin, one chain", free: []uint64{even, even, even, even}, n: 1, calls: 6,
			want: "[1] [2] [3] [4] [1] [2]"},
		{name: "round robin, all chains, rotating start", free: []uint64{even, even, even, even}, n: 4, calls: 3,
			want: "[1 2 3 4] [2 3 4 1] [3 4 1 2]"},
		{name: "n capped to the chains there are", free: []uint64{even, even, even}, n: 8, calls: 2,
			want: "[1 2 3] [2 3 1]"},
		{name: "n below 1 means 1", free: []uint64{even, even}, n: 0, calls: 2,
			want: "[1] [2]"},
		{name: "within 10% counts as balanced", free: []uint64{even, even * 95 / 100, even * 91 / 100}, n: 2, calls: 3,
			want: "[1 2] [2 3] [3 1]"},
		{name: "offline servers skipped", free: []uint64{even, even, even, even}, offline: []uint64{2, 4}, n: 2, calls: 3,
			want: "[1 3] [3 1] [1 3]"},
		{name: "full below 1%", free: []uint64{even, TiB / 200, even}, n: 3, calls: 2,
			want: "[1 3] [3 1]"},
		{name: "full below 64 MiB", free: []uint64{even, 60 << 20, even}, n: 1, calls: 3,
			want: "[1] [3] [1]"},
		{name: "everything offline", free: []uint64{even, even}, offline: []uint64{1, 2}, n: 1, calls: 1,
			wantErr: syscall.ENOSPC},
		{name: "everything full", free: []uint64{1 << 20, 1 << 20}, n: 1, calls: 1,
			wantErr: syscall.ENOSPC},
		{name: "no targets at all", n: 1, calls: 1, wantErr: syscall.ENOSPC},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := placementEnv(t, c.free...)
			if len(c.offline) > 0 {
				e.offline(c.offline...)
			}
			var got []string
			for range c.calls {
				ids, err := e.m.PickChains(context.Background(), c.n, 1)
				if c.wantErr != 0 {
					if !errors.Is(err, c.wantErr) {
						t.Fatalf("PickChains = %v, %v; want an error wrapping %v", ids, err, c.wantErr)
					}
					if c.wantErr == syscall.ENOSPC && !strings.Contains(err.Error(), "start a data server (weft data ...) or free space") {
						t.Errorf("ENOSPC error does not say what to do: %v", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("PickChains: %v", err)
				}
				got = append(got, fmt.Sprint(ids))
			}
			if s := strings.Join(got, " "); s != c.want {
				t.Errorf("picks %s, want %s", s, c.want)
			}
		})
	}
}

func TestPickChainsOtherReplicaCount(t *testing.T) {
	e := placementEnv(t, 500*GiB)
	if _, err := e.m.PickChains(context.Background(), 1, 3); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("PickChains with 3 replicas on chains of 1: %v, want EINVAL", err)
	}
	if ids, err := e.m.PickChains(context.Background(), 1, 0); err != nil || len(ids) != 1 {
		t.Errorf("PickChains with replicas 0 (= 1): %v, %v", ids, err)
	}
}

// TestWeightedPlacement checks that once free space drifts apart the
// choice follows free space, statistically over many files with a fixed
// seed, and still gives distinct chains.
func TestWeightedPlacement(t *testing.T) {
	free := []uint64{600 * GiB, 300 * GiB, 100 * GiB}
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			e := placementEnv(t, free...)
			e.m.rng = rand.New(rand.NewPCG(1, 2))
			const files = 20000
			first := make(map[uint64]int)
			for range files {
				ids, err := e.m.PickChains(context.Background(), n, 1)
				if err != nil {
					t.Fatal(err)
				}
				if len(ids) != n {
					t.Fatalf("got %v, want %d chains", ids, n)
				}
				seen := make(map[uint64]bool)
				for _, id := range ids {
					if seen[id] {
						t.Fatalf("chain %d picked twice: %v", id, ids)
					}
					seen[id] = true
				}
				first[ids[0]]++
			}
			// The first chain of each file is drawn in proportion to free space.
			for i, f := range free {
				want := float64(f) / float64(1000*GiB)
				got := float64(first[uint64(i+1)]) / files
				if math.Abs(got-want) > 0.02 {
					t.Errorf("chain %d (free %d GiB) is first for %.3f of files, want %.3f", i+1, f/GiB, got, want)
				}
			}
		})
	}
}
