package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestLossOfDataServerReReplicated: replicas 2 on 3 data servers; one is
// killed for good and its target removed. Every chain gets back to two
// serving members without it, and all data reads back.
func TestLossOfDataServerReReplicated(t *testing.T) {
	// Replicas 2 set once all three servers are registered, so that the
	// chains spread over them: chains made while the servers register one
	// by one put the first two targets in more chains than the third.
	c := newFailCluster(t, 3, nil, nil)
	r2 := filepath.Join(c.mount(), "r2")
	if err := os.Mkdir(r2, 0o755); err != nil {
		t.Fatal(err)
	}
	c.setReplicas(r2, 2)
	c.waitHealthy(2, failWait)
	// A client that fetched its chain table just before the chains were
	// made may not find them: write through a new mount.
	mnt := filepath.Join(c.mount(), "r2")
	const nFiles, size = 6, 12<<20 + 4321
	for i := 0; i < nFiles; i++ {
		name := fmt.Sprintf("f%d", i)
		if err := os.WriteFile(filepath.Join(mnt, name), pattern(name, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lost := c.data[2]
	target := c.targetOf(lost)
	lostBytes := dirBytes(lost.dir)
	if st, err := c.status(); err == nil {
		t.Logf("chains before the loss: %s", describeChains(st, 2))
	}
	lost.proc.Kill(t, syscall.SIGKILL)

	if c.helpHas("--meta", "target", "remove") {
		out, err := exec.Command(c.exe, "target", "remove", fmt.Sprint(target), "--meta", c.metaAddr).CombinedOutput()
		if err != nil {
			t.Fatalf("weft target remove %d: %v\n%s", target, err, out)
		}
		t.Logf("weft target remove %d: %s", target, bytes.TrimSpace(out))
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := c.mc.RemoveTarget(ctx, &weftv1.RemoveTargetRequest{TargetId: target})
		cancel()
		if err != nil {
			t.Fatalf("RemoveTarget %d: %v", target, err)
		}
		t.Logf("RemoveTarget %d: %d chains changed", target, resp.GetChainsChanged())
	}
	took := c.waitHealthy(2, failWait)
	t.Logf("re-replication: %d MiB that target %d held copied again in %v (%.1f MiB/s)",
		lostBytes>>20, target, took.Round(time.Millisecond), float64(lostBytes)/(1<<20)/took.Seconds())

	st, err := c.status()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("chains after the re-replication: %s", describeChains(st, 2))
	for _, ch := range st.GetChainList() {
		if !isWidth(ch, 2) {
			continue
		}
		for _, m := range ch.GetMembers() {
			if m.GetTargetId() == target {
				t.Errorf("chain %d still has the removed target %d: %v", ch.GetId(), target, ch.GetMembers())
			}
		}
	}
	fresh := filepath.Join(c.mount(), "r2")
	for i := 0; i < nFiles; i++ {
		name := fmt.Sprintf("f%d", i)
		got, err := os.ReadFile(filepath.Join(fresh, name))
		if err != nil || !bytes.Equal(got, pattern(name, size)) {
			t.Errorf("%s after the loss: err %v, correct %v", name, err, bytes.Equal(got, pattern(name, size)))
		}
	}
	t.Logf("%d chunks identical on both replicas after re-replication", c.checkReplicasIdentical(2))
}
