package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestFailureTimeout drives liveness with the fake clock: a server that
// stops heartbeating goes offline after the failure timeout, its chain's
// member with it (new version), and everything comes back on its next
// heartbeat, also across a restart of the manager.
func TestFailureTimeout(t *testing.T) {
	e := newEnv(t)
	e.register("sA", "a:1", report("tA1", 500*GiB))
	e.register("sB", "b:1", report("tB1", 500*GiB))
	check := func(when, want string) {
		t.Helper()
		e.m.checkLiveness(context.Background())
		if got := summary(e.table()); got != want {
			t.Errorf("%s:\n got %s\nwant %s", when, got, want)
		}
	}

	e.clock.advance(3 * time.Second)
	e.heartbeat(1, "a:1", report("tA1", 500*GiB))
	check("3s", "v2 1@1:1/1/a:1/serving 2@1:2/2/b:1/serving")
	e.clock.advance(2 * time.Second)
	check("5s: at the timeout, not past it", "v2 1@1:1/1/a:1/serving 2@1:2/2/b:1/serving")
	e.clock.advance(time.Second)
	e.heartbeat(1, "a:1", report("tA1", 500*GiB))
	check("6s: server 2 timed out", "v3 1@1:1/1/a:1/serving 2@2:2/2/b:1/offline")
	if logs := e.logs.String(); !strings.Contains(logs, "data server 2 (b:1) missed heartbeats for 5s: marked offline") {
		t.Errorf("no offline line in the log:\n%s", logs)
	}
	if s := e.m.Servers(); s[0].Online != true || s[1].Online != false || s[1].Targets[0].Online {
		t.Errorf("Servers() after server 2 timed out: %v", s)
	}
	if total, _, _ := e.m.Capacity(); total != TiB {
		t.Errorf("Capacity() total = %d with one of two targets online, want %d", total, TiB)
	}
	check("checked again", "v3 1@1:1/1/a:1/serving 2@2:2/2/b:1/offline")

	// An offline member stays offline across a restart until its server
	// is heard from again.
	e.restart()
	check("after restart", "v3 1@1:1/1/a:1/serving 2@2:2/2/b:1/offline")
	e.clock.advance(time.Second)
	resp := e.heartbeat(2, "b:1", report("tB1", 500*GiB))
	if got, want := summary(resp.Chains), "v4 1@1:1/1/a:1/serving 2@3:2/2/b:1/serving"; got != want {
		t.Errorf("heartbeat of the returning server:\n got %s\nwant %s", got, want)
	}

	// A target its server no longer reports goes offline on its own.
	e.register("sC", "c:1", report("tC1", 500*GiB), report("tC2", 500*GiB))
	e.heartbeat(3, "c:1", report("tC2", 500*GiB))
	if got, want := summary(e.table()), "v6 1@1:1/1/a:1/serving 2@3:2/2/b:1/serving 3@2:3/3/c:1/offline 4@1:4/3/c:1/serving"; got != want {
		t.Errorf("after target 3 went missing:\n got %s\nwant %s", got, want)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "target 3 (/srv/tC1) of data server 3 (c:1) is no longer reported: marked offline") {
		t.Errorf("no line about the missing target in the log:\n%s", logs)
	}
	e.register("sC", "c:1", report("tC1", 500*GiB), report("tC2", 500*GiB))
	if got, want := summary(e.table()), "v7 1@1:1/1/a:1/serving 2@3:2/2/b:1/serving 3@3:3/3/c:1/serving 4@1:4/3/c:1/serving"; got != want {
		t.Errorf("after target 3 came back:\n got %s\nwant %s", got, want)
	}
}

// TestRunMarksOffline runs the real liveness loop with short timeouts.
func TestRunMarksOffline(t *testing.T) {
	e := newEnvTimeouts(t, 10*time.Millisecond, 50*time.Millisecond)
	e.m.now = time.Now
	e.register("sA", "a:1", report("tA1", 500*GiB))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		e.m.Run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()

	waitFor := func(what string, cond func([]*weftv1.ServerStatus) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if cond(e.m.Servers()) {
				return
			}
		}
		t.Fatalf("%s: not within 10s; log:\n%s", what, e.logs.String())
	}
	waitFor("offline", func(s []*weftv1.ServerStatus) bool { return !s[0].Online })
	if tab := e.table(); tab.Chains[0].Members[0].State != stateOffline {
		t.Errorf("chain after timeout: %s", summary(tab))
	}
	// What a heartbeat changes is checked with the fake clock in
	// TestFailureTimeout; here only that the loop sees it.
	e.heartbeat(1, "a:1", report("tA1", 500*GiB))
	if logs := e.logs.String(); !strings.Contains(logs, "marked online") || !strings.Contains(logs, "missed heartbeats for 50ms: marked offline") {
		t.Errorf("log lacks the offline/online lines:\n%s", logs)
	}
	waitFor("offline again", func(s []*weftv1.ServerStatus) bool { return !s[0].Online })
}
