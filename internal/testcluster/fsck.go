package testcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// LeavesDamage declares that the test leaves the cluster damaged on
// purpose (corrupt chunks, a broken disk or network) in ways fsck
// reports as findings of the given kinds (e.g. "corrupt_chunk",
// "chain_not_checked"): the fsck at its end accepts those, and fails the
// test on any other finding.
func (c *Cluster) LeavesDamage(kinds ...string) {
	c.mu.Lock()
	c.damage = append(c.damage, kinds...)
	c.mu.Unlock()
}

// Fsck runs the meta service's fsck (with repair if asked) and returns
// its answer.
func (c *Cluster) Fsck(repair bool) *weftv1.FsckResponse {
	c.t.Helper()
	return Fsck(c.t, c.MetaAddr(), repair)
}

// Fsck runs the fsck of the meta service at addr (with repair if asked)
// and returns its answer; an error fails the test.
func Fsck(t testing.TB, addr string, repair bool) *weftv1.FsckResponse {
	t.Helper()
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatalf("testcluster: fsck: %v", err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := weftv1.NewMetaClient(cc).Fsck(ctx, &weftv1.FsckRequest{Repair: repair})
	if err != nil {
		t.Fatalf("testcluster: fsck of the meta service at %s: %v", addr, err)
	}
	return r
}

// CheckFsck runs the fsck of the meta service at addr and fails the test
// if it finds anything but findings of the kinds the test declared it
// leaves (see LeavesDamage).
//
// A server the meta service lists online may not answer yet (just
// restarted) or still refuse I/O until its own next heartbeat is answered
// (it fenced itself while the meta service was away): fsck then cannot
// check its chains, and is run again for up to 10 s.
func CheckFsck(t testing.TB, addr string, damage ...string) {
	t.Helper()
	r := Fsck(t, addr, false)
	for deadline := time.Now().Add(10 * time.Second); onlyUncheckedChains(r) && !slices.Contains(damage, "chain_not_checked") && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		r = Fsck(t, addr, false)
	}
	for _, p := range r.GetProblems() {
		if !slices.Contains(damage, p.GetKind()) || r.GetProblemsNotListed() > 0 {
			t.Errorf("testcluster: fsck at the end of the test found %d problems (damage the test leaves on purpose: %q):\n%s",
				len(r.GetProblems())+int(r.GetProblemsNotListed()), damage, DescribeFsck(r))
			return
		}
	}
}

// checkFsck unmounts, then runs fsck and fails the test on any finding
// but of the kinds declared with LeavesDamage, unless the test failed
// already or left the meta service stopped; servers left stopped are
// started first, so that their chunks are checked.
func (c *Cluster) checkFsck() {
	c.t.Helper()
	c.stopMounts()
	c.mu.Lock()
	stopped, damage := c.metaStop == nil, c.damage
	c.mu.Unlock()
	if stopped || c.t.Failed() {
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
	CheckFsck(c.t, c.MetaAddr(), damage...)
}

// onlyUncheckedChains reports whether r has findings and all of them
// are chains fsck could not check (a server unreachable).
func onlyUncheckedChains(r *weftv1.FsckResponse) bool {
	for _, p := range r.GetProblems() {
		if p.GetKind() != "chain_not_checked" {
			return false
		}
	}
	return len(r.GetProblems()) > 0
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
