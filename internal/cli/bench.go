package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/bench"
)

// benchFlags are the flags of "weft bench".
type benchFlags struct {
	records   string
	procs     string
	size      string
	files     int
	tarFiles  int
	walkFiles int
	repeat    int
	compare   bool
	report    string
	workloads string
	cold      string
	cpuMatch  string
}

func newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench [flags] DIR [DIR...]",
		Short: "Benchmark a directory (weft mount, local disk, any file system), or compare several",
		Long: `Benchmark the file system holding DIR the way IOZone, IOR and mdtest do:
sequential write (fsync counted), cold sequential read, re-read, random read,
strided read, random write and a 50/50 mixed workload at each record size and
process count, N processes writing disjoint ranges of one shared file;
mdtest-style create, stat, read, remove, mkdir and rmdir with each process in
its own directory and all in one shared directory; unpacking a generated
source tarball, walking and removing the tree; and the fairness of N
concurrent readers.

With --compare and several DIRs the same workloads run on every directory,
interleaved workload by workload, and the table gives the first directory's
rate divided by each other's (A/B above 1: A is faster); --repeat K repeats
the whole run and reports medians. Each measurement runs in separate worker processes started together.
Cold reads drop the page cache (as root) or the files' cached pages.

Examples:
  weft bench /mnt/weft
  weft bench --compare /mnt/weft /mnt/loopback /var/tmp/bench --repeat 3 --report bench-report
  weft bench --size 1GiB --records 1MiB --procs 1,8 --workloads data --cpu-match weft /mnt/weft`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 {
				return usagef("%s needs at least one directory", cmd.CommandPath())
			}
			if len(args) > 1 && !f.compare {
				return usagef("%s got %d directories: add --compare to compare them", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBench(cmd, f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.records, "records", "8KiB,256KiB,8MiB", "record sizes of the data workloads (comma separated)")
	fl.StringVar(&f.procs, "procs", "1,4", "process counts (comma separated); each process has its own file")
	fl.StringVar(&f.size, "size", "256MiB", "file size per process for the data workloads")
	fl.IntVar(&f.files, "files", 1000, "metadata workloads: files and directories per process")
	fl.IntVar(&f.tarFiles, "tar-files", 5000, "files in the generated source tarball")
	fl.IntVar(&f.walkFiles, "walk-files", 0, "walk group: files of a tree made once under DIR/weft-bench-tree-N (kept for the next run) and walked cold like du, e.g. 1000000; 0: no walk")
	fl.IntVar(&f.repeat, "repeat", 1, "repeat every workload this many times and report medians")
	fl.BoolVar(&f.compare, "compare", false, "compare the given directories (ratios against the first)")
	fl.StringVar(&f.report, "report", "", "write results.json, report.md and SVG plots into this directory")
	fl.StringVar(&f.workloads, "workloads", "", "only these groups (data, meta, tree, fair, walk), comma separated; default all (walk only with --walk-files)")
	fl.StringVar(&f.cold, "cold", "auto", "how cold reads start: auto (drop as root, else fadvise), drop (echo 3 > /proc/sys/vm/drop_caches), fadvise (POSIX_FADV_DONTNEED per file), none")
	fl.StringVar(&f.cpuMatch, "cpu-match", "", "also measure the CPU time of the processes whose command line contains this (e.g. weft), as core-ms per MB")
	return cmd
}

// runBench parses the flags, runs the benchmark and prints the table.
func runBench(cmd *cobra.Command, f benchFlags, dirs []string) error {
	cfg := bench.Config{Files: f.files, TarFiles: f.tarFiles, WalkFiles: f.walkFiles, Repeat: f.repeat, Cold: f.cold, CPUMatch: f.cpuMatch}
	for _, s := range splitList(f.records) {
		v, err := parseSize(s)
		if err != nil || v == 0 {
			return usagef("--records: %v", orZero(err, s))
		}
		cfg.Records = append(cfg.Records, int64(v))
	}
	for _, s := range splitList(f.procs) {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 256 {
			return usagef("--procs: %q is not a process count from 1 to 256", s)
		}
		cfg.Procs = append(cfg.Procs, v)
	}
	if len(cfg.Records) == 0 || len(cfg.Procs) == 0 {
		return usagef("--records and --procs need at least one value each")
	}
	size, err := parseSize(f.size)
	if err != nil || size == 0 {
		return usagef("--size: %v", orZero(err, f.size))
	}
	cfg.Size = int64(size)
	if f.files < 1 || f.tarFiles < 1 || f.repeat < 1 {
		return usagef("--files, --tar-files and --repeat must be at least 1")
	}
	for _, w := range splitList(f.workloads) {
		switch w {
		case bench.GroupData, bench.GroupMeta, bench.GroupTree, bench.GroupFair, bench.GroupWalk:
			cfg.Workloads = append(cfg.Workloads, w)
		default:
			return usagef("--workloads: unknown group %q (data, meta, tree, fair, walk)", w)
		}
	}
	switch f.cold {
	case "auto", "drop", "fadvise", "none":
	default:
		return usagef("--cold: %q is not one of auto, drop, fadvise, none", f.cold)
	}
	for _, d := range dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return failure("find the directory "+d, err, "give an existing directory")
		}
		cfg.Targets = append(cfg.Targets, abs)
	}
	exe, err := weftExecutable()
	if err != nil {
		return err
	}
	cfg.WorkerCmd = []string{exe, "bench-worker"}
	stderr := cmd.ErrOrStderr()
	prog := newProgress(stderr)
	cfg.Progress = prog.update
	if cold := f.cold; cold == "auto" && os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "weft bench: not root: cold reads drop each file's cached pages (POSIX_FADV_DONTNEED) instead of the whole page cache")
	}
	res, runErr := bench.Run(cmd.Context(), cfg)
	prog.finish()
	if res == nil || len(res.Measurements) == 0 {
		return failure("benchmark", runErr, "check that every directory is writable and has room for the files (--size times the largest --procs)")
	}
	// What was measured before a failure is still shown and reported.
	out := cmd.OutOrStdout()
	if err := bench.WriteTable(out, res, bench.Summarize(res)); err != nil {
		return err
	}
	if f.report != "" {
		if err := bench.WriteReport(f.report, res); err != nil {
			return failure("write the report to "+f.report, err, "check that the directory is writable")
		}
		fmt.Fprintf(out, "\nreport: %s (results.json, report.md, *.svg)\n", f.report)
	}
	if runErr != nil {
		return failure("benchmark (stopped early; the results above are partial)", runErr, "check that every directory is writable and has room for the files (--size times the largest --procs)")
	}
	return nil
}

// newBenchWorkerCmd is the hidden worker process of weft bench.
func newBenchWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "bench-worker",
		Short:  "One worker process of weft bench (reads its task on stdin)",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.WorkerMain(os.Stdin, cmd.OutOrStdout())
		},
	}
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// orZero explains a size that did not parse or was zero.
func orZero(err error, s string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("%q must be more than zero", s)
}

// progress shows what weft bench is doing: one line rewritten in place on
// a terminal, one line per finished measurement otherwise.
type progress struct {
	w    io.Writer
	tty  bool
	last string // the previous result, shown after the running step
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progress) update(ev bench.Progress) {
	if p.tty {
		if ev.Last == nil {
			fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s ...%s", ev.Done+1, ev.Total, ev.Label, p.last)
		} else {
			p.last = fmt.Sprintf(" (last: %s %.1f %s)", ev.Last.Workload, ev.Last.Rate(), ev.Last.Unit())
		}
		return
	}
	if ev.Last != nil {
		fmt.Fprintf(p.w, "[%d/%d] %s: %s %s\n", ev.Done, ev.Total, ev.Label, strconv.FormatFloat(ev.Last.Rate(), 'f', 1, 64), ev.Last.Unit())
	}
}

func (p *progress) finish() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
