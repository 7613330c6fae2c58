package campaign

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/testcluster"
)

func TestMain(m *testing.M) {
	MaybeSpawner()
	os.Exit(testcluster.Main(m))
}

// SeedEnv names the environment variable that replays a seed in the
// tests (make soak takes -seed).
const SeedEnv = "WEFT_CAMPAIGN_SEED"

// runShort runs a short campaign and fails t with its findings.
func runShort(t *testing.T, cfg Config) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skip("the campaign mounts file systems and kills their servers: run it as root with /dev/fuse")
	}
	if s := os.Getenv(SeedEnv); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q is not an integer seed", SeedEnv, s)
		}
		cfg.Seed = seed
	}
	cfg.Weft, cfg.Dir, cfg.Logf = testcluster.Binary(t), t.TempDir(), t.Logf
	start := time.Now()
	res, err := Run(cfg)
	if err != nil {
		t.Fatalf("campaign could not run: %v", err)
	}
	t.Logf("campaign of %v: %s", time.Since(start).Round(time.Second), res.Summary)
	for _, f := range res.Findings {
		t.Errorf("%s %s", f.At.Format("15:04:05.000"), f.What)
	}
	if t.Failed() {
		for _, e := range res.Errors {
			t.Logf("error seen: %s", e)
		}
		t.Logf("replay: %s=%d go test -run '%s' ./internal/campaign (or make soak SOAK_ARGS='%s')",
			SeedEnv, res.Config.Seed, t.Name(), res.Config.Replay())
		for _, name := range []string{"meta1", "data1", "data2", "mount1", "mount2"} {
			t.Logf("--- end of %s.log:\n%s", name, logTail(filepath.Join(cfg.Dir, "logs"), name, 15))
		}
	}
}

// TestCampaignEmbedded runs a short seeded fault campaign on the embedded
// engine: one meta server, four data servers (replicas 2 and 3), two
// mounts with a data and a metadata workload each, faults of every kind
// in shortKinds.
func TestCampaignEmbedded(t *testing.T) {
	kinds, err := ParseKinds(shortKinds)
	if err != nil {
		t.Fatal(err)
	}
	runShort(t, Config{Duration: 25 * time.Second, Kinds: kinds, RecoveryBound: 8 * time.Second, Quiet: 12 * time.Second, Overlap: -1,
		UnavailableTimeout: 30 * time.Second})
}

// TestCampaignEtcd runs a short campaign with two meta servers over
// etcd (killed, stopped, cut off etcd, slowed) and the faults of
// shortKinds.
func TestCampaignEtcd(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("etcd is not installed (apt-get install etcd-server)")
		}
		t.Skip("etcd is not installed (apt-get install etcd-server)")
	}
	kinds, err := ParseKinds(shortKinds)
	if err != nil {
		t.Fatal(err)
	}
	runShort(t, Config{Engine: Etcd, Duration: 25 * time.Second, Kinds: kinds, RecoveryBound: 8 * time.Second, Quiet: 12 * time.Second, Overlap: -1,
		UnavailableTimeout: 30 * time.Second})
}

// shortKinds are the fault kinds of the campaigns in the test suite:
// every kind, one fault at a time, with mounts that wait out outages.
const shortKinds = "all"
