package testcluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// LeavesDamage declares that the test damages the cluster on purpose
// (corrupts chunks, drops records): the fsck at its end does not fail it.
// Such a test checks Fsck's findings itself.
func (c *Cluster) LeavesDamage() {
	c.mu.Lock()
	c.damaged = true
	c.mu.Unlock()
}

// Fsck runs the meta service's fsck (with repair if asked) and returns
// its answer.
func (c *Cluster) Fsck(repair bool) *weftv1.FsckResponse {
	c.t.Helper()
	svc := c.Meta()
	if svc == nil {
		c.t.Fatal("testcluster: fsck: the meta service is stopped")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := svc.Fsck(ctx, &weftv1.FsckRequest{Repair: repair})
	if err != nil {
		c.t.Fatalf("testcluster: fsck: %v", err)
	}
	return r
}

// checkFsck unmounts, then runs fsck and fails the test on any finding,
// unless the test failed already, declared LeavesDamage, or left the
// meta service stopped; servers left stopped are started first, so that
// their chunks are checked.
func (c *Cluster) checkFsck() {
	c.t.Helper()
	c.stopMounts()
	c.mu.Lock()
	skip := c.damaged || c.metaStop == nil
	c.mu.Unlock()
	if skip || c.t.Failed() {
		return
	}
	for i, ds := range c.data {
		c.mu.Lock()
		stopped := ds.stop == nil
		c.mu.Unlock()
		if stopped {
			c.StartData(i)
		}
	}
	c.WaitOnline(len(c.data))
	if r := c.Fsck(false); len(r.GetProblems()) > 0 || r.GetProblemsNotListed() > 0 {
		c.t.Errorf("testcluster: fsck at the end of the test found %d problems (a test that damages the cluster on purpose calls LeavesDamage):\n%s",
			len(r.GetProblems())+int(r.GetProblemsNotListed()), DescribeFsck(r))
	}
}

// DescribeFsck lists fsck's findings, one a line.
func DescribeFsck(r *weftv1.FsckResponse) string {
	var b strings.Builder
	for _, p := range r.GetProblems() {
		fmt.Fprintf(&b, "  %s ino %d parent %d name %q: %s (repaired %v)\n", p.GetKind(), p.GetIno(), p.GetParent(), p.GetName(), p.GetDetail(), p.GetRepaired())
	}
	if n := r.GetProblemsNotListed(); n > 0 {
		fmt.Fprintf(&b, "  and %d more\n", n)
	}
	return b.String()
}
