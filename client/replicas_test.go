package client

import (
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestPickReader checks the replica choice for reads on made-up latencies.
func TestPickReader(t *testing.T) {
	chain := func(states ...string) *weftv1.Chain {
		ch := &weftv1.Chain{Id: 1, Version: 1}
		for i, s := range states {
			ch.Members = append(ch.Members, &weftv1.ChainMember{TargetId: uint64(i + 1), Address: string(rune('a' + i)), State: s})
		}
		return ch
	}
	ms := time.Millisecond
	tests := []struct {
		name  string
		ch    *weftv1.Chain
		rtt   map[string]time.Duration
		down  []string
		tried []string
		want  map[string]bool // acceptable picks; nil: none
	}{
		{name: "only serving members", ch: chain("serving", "syncing", "offline"), want: map[string]bool{"a": true}},
		{name: "nearest of three", ch: chain("serving", "serving", "serving"),
			rtt: map[string]time.Duration{"a": 30 * ms, "b": 2 * ms, "c": 40 * ms}, want: map[string]bool{"b": true}},
		{name: "equally near share", ch: chain("serving", "serving", "serving"),
			rtt: map[string]time.Duration{"a": 30 * ms, "b": 2 * ms, "c": 2500 * time.Microsecond}, want: map[string]bool{"b": true, "c": true}},
		{name: "unmeasured counts as near", ch: chain("serving", "serving"),
			rtt: map[string]time.Duration{"a": 30 * ms}, want: map[string]bool{"b": true}},
		{name: "tried skipped", ch: chain("serving", "serving", "serving"),
			rtt: map[string]time.Duration{"a": 30 * ms, "b": 2 * ms, "c": 150 * ms}, tried: []string{"b"}, want: map[string]bool{"a": true}},
		{name: "down avoided", ch: chain("serving", "serving"),
			rtt: map[string]time.Duration{"a": 2 * ms, "b": 30 * ms}, down: []string{"a"}, want: map[string]bool{"b": true}},
		{name: "all down: still tried", ch: chain("serving"), down: []string{"a"}, want: map[string]bool{"a": true}},
		{name: "all tried", ch: chain("serving", "serving"), tried: []string{"a", "b"}},
		{name: "none serving: head fallback", ch: chain("offline"), want: map[string]bool{"a": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tab chainTable
			tab.init(nil)
			for addr, d := range tt.rtt {
				tab.stat(addr).observe(d, 4096)
			}
			for _, addr := range tt.down {
				tab.stat(addr).markDown()
			}
			tried := map[string]bool{}
			for _, addr := range tt.tried {
				tried[addr] = true
			}
			seen := map[string]bool{}
			for range 50 {
				m := tab.pickReader(tt.ch, tried)
				if m == nil {
					if tt.want != nil {
						t.Fatalf("no member picked, want one of %v", tt.want)
					}
					return
				}
				if !tt.want[m.Address] {
					t.Fatalf("picked %s, want one of %v", m.Address, tt.want)
				}
				seen[m.Address] = true
			}
			if len(seen) != len(tt.want) {
				t.Errorf("picked only %v over 50 reads, want each of %v", seen, tt.want)
			}
		})
	}
}

// TestReadLatencyEstimate checks the latency average that picks replicas
// on sequences of reads 10 ms apart: one stalled read does not make a
// near replica look far, a replica that became slow looks far after a few
// reads, and a far replica read again after a while looks far at once.
func TestReadLatencyEstimate(t *testing.T) {
	ms := time.Millisecond
	repeat := func(d time.Duration, n int) []time.Duration {
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = d
		}
		return s
	}
	near := ms / 2
	// far: beyond nearRatio times the near replica's latency, plus slack.
	far := time.Duration(nearRatio*float64(near)) + rttSlack
	tests := []struct {
		name    string
		reads   []time.Duration
		gap     time.Duration // before the last read
		wantFar bool
		within  int // wantFar: at most this many of the last reads
	}{
		{name: "one stalled read", reads: append(repeat(near, 20), 200*ms), wantFar: false},
		{name: "two stalled reads", reads: append(repeat(near, 20), 200*ms, 150*ms), wantFar: false},
		{name: "became slow", reads: append(repeat(near, 20), repeat(20*ms, 6)...), wantFar: true, within: 6},
		{name: "far from the start", reads: repeat(20*ms, 1), wantFar: true, within: 1},
		{name: "far, read again after a while", reads: repeat(20*ms, 5), gap: 10 * time.Second, wantFar: true, within: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s serverStat
			now := time.Now()
			firstFar := -1
			for i, d := range tt.reads {
				now = now.Add(10 * ms)
				if i == len(tt.reads)-1 {
					now = now.Add(tt.gap)
				}
				if before, _ := s.view(now); before <= far {
					firstFar = -1 // near (or faded) until this read
				}
				s.observeAt(now, d, 4096)
				if est, _ := s.view(now); est > far && firstFar < 0 {
					firstFar = i
				}
			}
			est, _ := s.view(now)
			if gotFar := est > far; gotFar != tt.wantFar {
				t.Fatalf("latency estimate %v after %v; far (over %v): %v, want %v", est, tt.reads, far, gotFar, tt.wantFar)
			}
			if tt.wantFar && len(tt.reads)-firstFar > tt.within {
				t.Errorf("seen far only after %d of the last reads, want within %d", len(tt.reads)-firstFar, tt.within)
			}
		})
	}
}
