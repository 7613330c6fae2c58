// Command soak runs a long randomized fault campaign against weft (see
// package campaign): `make soak` runs it with SOAK_ARGS.
//
//	go run ./internal/campaign/soak -duration 30m -seed 42 -kinds all,-client-pause
//
// The seed and the schedule are printed first; the same flags replay a
// campaign. It exits 1 when the campaign found violations of the
// contract, 2 when it could not run.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/weft-fs/weft/internal/campaign"
)

func main() {
	campaign.MaybeSpawner()
	os.Exit(run())
}

func run() int {
	var (
		cfg       campaign.Config
		kinds     string
		engine    string
		keep      bool
		weft, dir string
	)
	flag.StringVar(&weft, "weft", "", "weft binary to run (default: build ./cmd/weft into the campaign's directory)")
	flag.StringVar(&dir, "dir", "", "directory of the campaign's processes and logs (default: a new temporary one)")
	flag.BoolVar(&keep, "keep", false, "keep the directory (and its logs) when the campaign passes")
	flag.Int64Var(&cfg.Seed, "seed", envInt("SOAK_SEED"), "seed of the schedule and the workloads (0: from the clock; env SOAK_SEED)")
	flag.DurationVar(&cfg.Duration, "duration", envDuration("SOAK_DURATION", 10*time.Minute), "how long faults are injected (env SOAK_DURATION)")
	flag.StringVar(&kinds, "kinds", envString("SOAK_KINDS", "all"), "fault kinds: all, none, a class (data, meta, client) or kinds, comma-separated; -KIND removes one (env SOAK_KINDS)")
	flag.StringVar(&engine, "engine", envString("SOAK_ENGINE", "embedded"), "metadata engine: embedded or etcd (env SOAK_ENGINE)")
	flag.IntVar(&cfg.MetaServers, "meta-servers", 2, "meta servers with -engine etcd")
	flag.IntVar(&cfg.DataServers, "data-servers", 4, "data servers (at least 3)")
	flag.IntVar(&cfg.Mounts, "mounts", 2, "mounts the workloads run on")
	flag.DurationVar(&cfg.RecoveryBound, "recovery-bound", 20*time.Second, "errors may go on this long after a fault ends")
	flag.DurationVar(&cfg.UnavailableTimeout, "unavailable-timeout", 5*time.Second, "the mounts' --unavailable-timeout (short: outages reach the workloads as errors)")
	flag.Float64Var(&cfg.Overlap, "overlap", 0.2, "probability that a fault starts before the last one ended (negative: never)")
	flag.Parse()
	var err error
	if cfg.Kinds, err = campaign.ParseKinds(kinds); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	cfg.Engine = campaign.Engine(engine)
	if dir == "" {
		if dir, err = os.MkdirTemp("", "weft-soak-"); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 2
		}
	}
	if weft == "" {
		weft = filepath.Join(dir, "weft")
		if out, err := exec.Command("go", "build", "-o", weft, "github.com/weft-fs/weft/cmd/weft").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "soak: go build ./cmd/weft: %v\n%s", err, out)
			return 2
		}
	}
	if weft, err = filepath.Abs(weft); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	cfg.Weft, cfg.Dir = weft, filepath.Join(dir, "cluster")
	cfg.Logf = func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	start := time.Now()
	res, err := campaign.Run(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: the campaign could not run: %v (logs in %s)\n", err, filepath.Join(cfg.Dir, "logs"))
		return 2
	}
	fmt.Printf("soak: %v, %d faults: %s\n", time.Since(start).Round(time.Second), len(res.Schedule), res.Summary)
	if len(res.Errors) > 0 {
		fmt.Println("soak: errors seen (the first of each worker and operation):")
		for _, e := range res.Errors {
			fmt.Println("  " + e)
		}
	}
	if len(res.Findings) == 0 {
		fmt.Println("soak: no findings")
		if !keep {
			os.RemoveAll(dir)
		}
		return 0
	}
	fmt.Printf("soak: %d findings (logs in %s):\n", len(res.Findings), filepath.Join(cfg.Dir, "logs"))
	for _, f := range res.Findings {
		fmt.Printf("  %s %s\n", f.At.Format("15:04:05.000"), f.What)
	}
	fmt.Printf("soak: replay with: go run ./internal/campaign/soak %s\n", res.Config.Replay())
	return 1
}

func envString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string) int64 {
	v, _ := strconv.ParseInt(os.Getenv(name), 10, 64)
	return v
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}
