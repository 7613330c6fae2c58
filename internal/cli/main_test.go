package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestMain(m *testing.M) {
	testscript.Main(buildingM{m}, map[string]func(){"weft": weftMain})
}

// weftMain is the "weft" command of the scripts: the real CLI, run in a
// copy of the test binary.
func weftMain() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// buildingM runs the tests through testcluster.Main, which provides the
// weft binary (testcluster.Binary): weft up re-executes it (through
// $WEFT_EXE) for its daemons, and the process tests run it. Only the
// top-level test process does, not the script commands.
type buildingM struct{ m *testing.M }

func (b buildingM) Run() int { return testcluster.Main(b.m) }

func TestScripts(t *testing.T) {
	weftBinary := testcluster.Binary(t)
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			env.Setenv("WEFT_EXE", weftBinary)
			env.Setenv("WEFT_RUNTIME_DIR", filepath.Join(env.WorkDir, "run"))
			work := env.WorkDir
			env.Defer(func() { testcluster.CleanupUnder(work) })
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "fuse":
				return haveFUSE(), nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitfile":    cmdWaitFile,
			"waitmount":   cmdWaitMount,
			"waitonline":  cmdWaitOnline,
			"waitoffline": cmdWaitOffline,
			"waithealthy": cmdWaitHealthy,
			"mounted":     cmdMounted,
			"envfile":     cmdEnvFile,
		},
	})
}

func haveFUSE() bool {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return false
	}
	if os.Geteuid() == 0 {
		return true
	}
	_, err := exec.LookPath("fusermount3")
	return err == nil
}

// scriptTimeout bounds the waits of the script commands.
const scriptTimeout = 90 * time.Second

// cmdWaitFile waits until a file exists: waitfile PATH.
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitfile PATH")
	}
	p := ts.MkAbs(args[0])
	deadline := time.Now().Add(scriptTimeout)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	ts.Fatalf("timed out waiting for %s", p)
}

// cmdWaitMount waits until DIR is a weft mount: waitmount DIR.
func cmdWaitMount(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitmount DIR")
	}
	if err := waitMounted(ts.MkAbs(args[0]), scriptTimeout); err != nil {
		ts.Fatalf("%v", err)
	}
}

// cmdMounted checks whether DIR is a weft mount: [!] mounted DIR.
func cmdMounted(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: mounted DIR")
	}
	dir := ts.MkAbs(args[0])
	got := isMounted(dir)
	if got == neg {
		ts.Fatalf("%s mounted: %v", dir, got)
	}
}

// cmdEnvFile sets an environment variable to a file's trimmed content:
// envfile VAR PATH.
func cmdEnvFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: envfile VAR PATH")
	}
	b, err := os.ReadFile(ts.MkAbs(args[1]))
	ts.Check(err)
	ts.Setenv(args[0], strings.TrimSpace(string(b)))
}

// cmdWaitOnline waits until the meta service at ADDR reports N data
// servers online: waitonline ADDR N.
func cmdWaitOnline(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitonline ADDR N")
	}
	var n int
	if _, err := fmt.Sscan(args[1], &n); err != nil {
		ts.Fatalf("waitonline: bad count %q", args[1])
	}
	if err := waitOnline(args[0], n, scriptTimeout); err != nil {
		ts.Fatalf("%v", err)
	}
}

// cmdWaitOffline waits until the meta service at ADDR reports at most N
// data servers online: waitoffline ADDR N.
func cmdWaitOffline(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitoffline ADDR N")
	}
	var n int
	if _, err := fmt.Sscan(args[1], &n); err != nil {
		ts.Fatalf("waitoffline: bad count %q", args[1])
	}
	if err := waitServers(args[0], func(online int) bool { return online <= n }, scriptTimeout); err != nil {
		ts.Fatalf("%v", err)
	}
}

// cmdWaitHealthy waits until the meta service at ADDR reports HEALTH_OK,
// or with REPLICAS until every chain of that width is healthy:
// waithealthy ADDR [REPLICAS].
func cmdWaitHealthy(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: waithealthy ADDR [REPLICAS]")
	}
	var width uint32
	if len(args) == 2 {
		if _, err := fmt.Sscan(args[1], &width); err != nil {
			ts.Fatalf("waithealthy: bad replica count %q", args[1])
		}
	}
	ok := func(st *weftv1.StatusResponse) bool {
		if width == 0 {
			return healthLine(st) == healthOK
		}
		for _, s := range st.GetChainSummaries() {
			if s.GetReplicas() == width {
				return s.GetTotal() > 0 && s.GetHealthy() == s.GetTotal() && st.GetSyncBytesLeft() == 0
			}
		}
		return false
	}
	deadline := time.Now().Add(scriptTimeout)
	last := ""
	for time.Now().Before(deadline) {
		st, err := fetchStatus(context.Background(), args[0])
		if err == nil {
			if ok(st) {
				return
			}
			last = healthLine(st)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	ts.Fatalf("timed out waiting for healthy chains at %s; last: %s", args[0], last)
}

// waitOnline polls the meta service at addr until n servers are online.
func waitOnline(addr string, n int, timeout time.Duration) error {
	return waitServers(addr, func(online int) bool { return online >= n }, timeout)
}

// waitServers polls the meta service at addr until ok(servers online).
func waitServers(addr string, ok func(online int) bool, timeout time.Duration) error {
	online := 0
	err := testcluster.WaitStatus(addr, timeout, func(st *weftv1.StatusResponse) bool {
		online = onlineCount(st)
		return ok(online)
	})
	if err != nil {
		return fmt.Errorf("waiting for the data servers at %s (%d online): %w", addr, online, err)
	}
	return nil
}

// isMounted reports whether dir is a weft mount point now.
func isMounted(dir string) bool {
	mp, err := findWeftMount(dir)
	return err == nil && mp == dir
}

// waitMounted polls until dir is a weft mount.
func waitMounted(dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if isMounted(dir) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("timed out waiting for a weft mount on %s", dir)
}
