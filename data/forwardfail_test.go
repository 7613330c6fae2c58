package data

import (
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestForwardFailures: a member's failure to forward is reported until
// its next forward succeeds, the chain's version changes, or it has been
// quiet for forwardFailureMemory.
func TestForwardFailures(t *testing.T) {
	view := func(id, version uint64) *chainView { return &chainView{id: id, version: version} }
	next := &weftv1.ChainMember{TargetId: 9, ServerId: 3, Address: "h:3"}
	for _, c := range []struct {
		name  string
		after func(f *forwardFailures, m member)
		want  int
	}{
		{"failing", func(*forwardFailures, member) {}, 1},
		{"forward succeeded", func(f *forwardFailures, m member) { f.ok(m) }, 0},
		{"same version", func(f *forwardFailures, m member) { f.dropStale(map[uint64]*chainView{4: view(4, 7)}) }, 1},
		{"new version", func(f *forwardFailures, m member) { f.dropStale(map[uint64]*chainView{4: view(4, 8)}) }, 0},
		{"chain gone", func(f *forwardFailures, m member) { f.dropStale(map[uint64]*chainView{}) }, 0},
		{"quiet", func(f *forwardFailures, m member) {
			f.m[forwardKey{4, 2}].last = time.Now().Add(-forwardFailureMemory - time.Second)
		}, 0},
	} {
		var f forwardFailures
		m := member{view: view(4, 7), targetID: 2}
		f.failed(m, next, "connection refused")
		c.after(&f, m)
		got := f.report()
		if len(got) != c.want {
			t.Errorf("%s: %d failures reported, want %d: %v", c.name, len(got), c.want, got)
			continue
		}
		if c.want == 1 {
			r := got[0]
			if r.ChainId != 4 || r.ChainVersion != 7 || r.TargetId != 2 || r.NextTargetId != 9 || r.NextServerId != 3 ||
				r.NextAddress != "h:3" || r.Error != "connection refused" {
				t.Errorf("%s: reported %v", c.name, r)
			}
		}
		if c.want == 0 && f.n.Load() != 0 {
			t.Errorf("%s: %d failures counted after none is left", c.name, f.n.Load())
		}
	}
}
