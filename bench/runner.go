// Package bench is weft's built-in file system benchmark: IOZone/IOR-style
// data workloads (sequential, random, strided and mixed I/O at several
// record sizes and process counts), mdtest-style metadata rates, a tree
// walk and a tarball unpack, and per-client fairness. It runs against any
// directory, so the same run measures a weft mount, a FUSE loopback and the
// local disk side by side (Run with several targets interleaves them
// workload by workload).
//
// Every measurement runs in real worker processes (the hidden
// "weft bench-worker" command) that prepare their buffers, file
// descriptors and offsets, wait at a barrier and then do the timed part
// without allocating.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Config describes a run.
type Config struct {
	Targets   []string // directories to measure; results are compared against the first
	Records   []int64  // record sizes of the data workloads
	Procs     []int    // process counts
	Size      int64    // bytes per process file
	Files     int      // metadata entries per process
	TarFiles  int      // files in the generated tarball
	WalkFiles int      // files of the prepared tree of the walk group (0: no walk group)
	Repeat    int      // repetitions; the report quotes medians
	Workloads []string // groups (data, meta, tree, fair) or workload names; empty: all
	Cold      string   // "auto" (drop caches as root, else fadvise), "drop", "fadvise", "none"
	CPUMatch  string   // also measure the CPU time of processes whose command line contains this
	// WorkerCmd starts a worker process (e.g. {"/usr/bin/weft", "bench-worker"}).
	WorkerCmd []string
	WorkerEnv []string // extra environment of the workers
	Progress  func(p Progress)
}

// Progress tells what the run is doing: step Done of Total, the step being
// measured, and the last finished measurement (nil while one starts).
type Progress struct {
	Done, Total int
	Label       string
	Last        *Measurement
}

// wantGroup reports whether the group g (or one of its workloads) is
// selected.
func (c *Config) wantGroup(g string) bool {
	if len(c.Workloads) == 0 {
		return true
	}
	return slices.Contains(c.Workloads, g)
}

// Measurement is one workload on one target, one repetition.
type Measurement struct {
	Workload   string          `json:"workload"`
	Group      string          `json:"group"`
	Target     string          `json:"target"`
	TargetIdx  int             `json:"target_index"`
	Record     int64           `json:"record_bytes,omitempty"`
	Procs      int             `json:"procs"`
	Repeat     int             `json:"repeat"`
	Bytes      int64           `json:"bytes"`
	Ops        int64           `json:"ops"`
	Wall       float64         `json:"wall_seconds"`
	MBps       float64         `json:"mb_per_s,omitempty"`
	OpsPerSec  float64         `json:"ops_per_s"`
	WorkerCPU  float64         `json:"worker_cpu_seconds"`
	MatchCPU   float64         `json:"match_cpu_seconds,omitempty"`
	CoreMsPerM float64         `json:"match_core_ms_per_mb,omitempty"`
	CoreMsOp   float64         `json:"match_core_ms_per_op,omitempty"` // metadata and tree workloads
	PeakRSS    int64           `json:"match_peak_rss_bytes,omitempty"` // largest VmHWM of the matched processes so far
	Cold       string          `json:"cold,omitempty"`
	Spread     float64         `json:"spread,omitempty"` // slowest/fastest worker rate
	Workers    []WorkerMeasure `json:"workers"`
}

// WorkerMeasure is one worker process's share of a measurement.
type WorkerMeasure struct {
	Bytes     int64   `json:"bytes"`
	Ops       int64   `json:"ops"`
	Seconds   float64 `json:"seconds"`
	MBps      float64 `json:"mb_per_s,omitempty"`
	OpsPerSec float64 `json:"ops_per_s"`
	CPU       float64 `json:"cpu_seconds"`
}

// Rate is the headline figure: MB/s for data workloads, ops/s otherwise.
func (m *Measurement) Rate() float64 {
	if isDataWorkload(m.Workload) {
		return m.MBps
	}
	return m.OpsPerSec
}

// Unit is "MB/s" or "ops/s".
func (m *Measurement) Unit() string {
	if isDataWorkload(m.Workload) {
		return "MB/s"
	}
	return "ops/s"
}

// Results is everything a run measured.
type Results struct {
	Started      time.Time     `json:"started"`
	Finished     time.Time     `json:"finished"`
	Targets      []string      `json:"targets"`
	Records      []int64       `json:"records"`
	Procs        []int         `json:"procs"`
	Size         int64         `json:"size_per_process"`
	Files        int           `json:"files_per_process"`
	TarFiles     int           `json:"tar_files"`
	Repeat       int           `json:"repeat"`
	Cold         string        `json:"cold"`
	CPUMatch     string        `json:"cpu_match,omitempty"`
	Measurements []Measurement `json:"measurements"`
}

// Run measures every selected workload on every target, target after
// target for each workload, Repeat times.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("no target directory given")
	}
	if len(cfg.WorkerCmd) == 0 {
		return nil, errors.New("no worker command configured")
	}
	for _, t := range cfg.Targets {
		st, err := os.Stat(t)
		if err != nil || !st.IsDir() {
			return nil, fmt.Errorf("target %s is not a directory (%v); create it first", t, err)
		}
	}
	if cfg.Repeat < 1 {
		cfg.Repeat = 1
	}
	cfg.Cold = resolveCold(cfg.Cold)
	res := &Results{Started: time.Now().UTC(), Targets: cfg.Targets, Records: cfg.Records, Procs: cfg.Procs, Size: cfg.Size,
		Files: cfg.Files, TarFiles: cfg.TarFiles, Repeat: cfg.Repeat, Cold: cfg.Cold, CPUMatch: cfg.CPUMatch}
	steps := plan(&cfg)
	total := 0
	for _, s := range steps {
		if !s.untimed {
			total++
		}
	}
	total *= cfg.Repeat * len(cfg.Targets)
	done := 0
	defer func() {
		res.Finished = time.Now().UTC()
		for _, t := range cfg.Targets {
			os.RemoveAll(benchDir(t))
		}
	}()
	for rep := 0; rep < cfg.Repeat; rep++ {
		for _, s := range steps {
			for ti, target := range cfg.Targets {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				if s.untimed && s.action != nil {
					if err := s.action(target); err != nil {
						return res, fmt.Errorf("%s on %s: %w", s.workload, target, err)
					}
					continue
				}
				label := stepLabel(&s, target)
				if !s.untimed && cfg.Progress != nil {
					cfg.Progress(Progress{Done: done, Total: total, Label: label})
				}
				m, err := runStep(ctx, &cfg, &s, target)
				if err != nil {
					return res, fmt.Errorf("%s: %w", label, err)
				}
				if s.untimed {
					continue
				}
				m.TargetIdx, m.Repeat = ti, rep
				res.Measurements = append(res.Measurements, *m)
				done++
				if cfg.Progress != nil {
					cfg.Progress(Progress{Done: done, Total: total, Label: label, Last: m})
				}
			}
		}
	}
	return res, nil
}

// stepLabel names a step on a target for progress lines and errors.
func stepLabel(s *step, target string) string {
	var b strings.Builder
	b.WriteString(s.workload)
	if s.record > 0 {
		b.WriteString(" " + FormatSize(s.record))
	}
	fmt.Fprintf(&b, " x%d on %s", s.procs, target)
	return b.String()
}

// resolveCold picks how cold reads start: "drop" (echo 3 >
// /proc/sys/vm/drop_caches, needs root), else "fadvise" (POSIX_FADV_DONTNEED
// on each file).
func resolveCold(c string) string {
	if c == "" || c == "auto" {
		if os.Geteuid() == 0 {
			return "drop"
		}
		return "fadvise"
	}
	return c
}

// dropCaches writes dirty data back and empties the page cache, dentries
// and inodes of the whole machine.
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}

// worker is a running worker process.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr *lockedBuffer
}

// runStep runs one step on one target: its workers start together after
// all of them are ready, and the wall time runs from the start signal to
// the last result.
func runStep(ctx context.Context, cfg *Config, s *step, target string) (*Measurement, error) {
	if s.prepare != nil {
		if err := s.prepare(target); err != nil {
			return nil, err
		}
	}
	tasks := s.tasks(target)
	cold := ""
	if s.cold {
		cold = cfg.Cold
		switch cold {
		case "drop":
			if err := dropCaches(); err != nil {
				return nil, fmt.Errorf("drop the page cache: %w; run as root or use --cold fadvise", err)
			}
		case "fadvise":
			for i := range tasks {
				tasks[i].Cold = "fadvise"
			}
		}
	}
	workers := make([]*worker, 0, len(tasks))
	kill := func() {
		for _, w := range workers {
			w.cmd.Process.Kill()
			w.cmd.Wait()
		}
	}
	for i := range tasks {
		w, err := startWorker(ctx, cfg, &tasks[i])
		if err != nil {
			kill()
			return nil, err
		}
		workers = append(workers, w)
	}
	for _, w := range workers {
		var hello workerHello
		if err := readLine(w, &hello); err != nil || !hello.Ready {
			kill()
			if err == nil {
				err = errors.New(hello.Err)
			}
			return nil, err
		}
	}
	cpu0 := matchCPU(cfg.CPUMatch)
	cpu0.resetPeakRSS()
	start := time.Now()
	for _, w := range workers {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			kill()
			return nil, fmt.Errorf("start a worker: %w", err)
		}
	}
	results := make([]workerResult, len(workers))
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = readLine(w, &results[i])
		}()
	}
	wg.Wait()
	wall := time.Since(start).Seconds()
	cpu1 := matchCPU(cfg.CPUMatch)
	for i, w := range workers {
		w.stdin.Close()
		werr := w.cmd.Wait()
		if errs[i] == nil && results[i].Err != "" {
			errs[i] = errors.New(results[i].Err)
		}
		if errs[i] == nil && werr != nil {
			errs[i] = fmt.Errorf("worker: %v: %s", werr, strings.TrimSpace(w.stderr.String()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if s.cleanup != nil {
		if err := s.cleanup(target); err != nil {
			return nil, err
		}
	}
	m := &Measurement{Workload: s.workload, Group: s.group, Target: target, Record: s.record, Procs: len(workers), Wall: wall, Cold: cold}
	minR, maxR := 0.0, 0.0
	for i, r := range results {
		wm := WorkerMeasure{Bytes: r.Bytes, Ops: r.Ops, Seconds: r.Seconds, CPU: r.CPUSeconds}
		if r.Seconds > 0 {
			wm.MBps = float64(r.Bytes) / 1e6 / r.Seconds
			wm.OpsPerSec = float64(r.Ops) / r.Seconds
		}
		m.Bytes += r.Bytes
		m.Ops += r.Ops
		m.WorkerCPU += r.CPUSeconds
		m.Workers = append(m.Workers, wm)
		rate := wm.OpsPerSec
		if isDataWorkload(s.workload) {
			rate = wm.MBps
		}
		if i == 0 || rate < minR {
			minR = rate
		}
		if i == 0 || rate > maxR {
			maxR = rate
		}
	}
	if wall > 0 {
		m.MBps = float64(m.Bytes) / 1e6 / wall
		m.OpsPerSec = float64(m.Ops) / wall
	}
	if cfg.CPUMatch != "" {
		m.MatchCPU = cpu1.minus(cpu0)
		m.PeakRSS = cpu1.peakRSS(cpu0)
		if m.Bytes > 0 {
			m.CoreMsPerM = m.MatchCPU * 1000 / (float64(m.Bytes) / 1e6)
		}
		if m.Ops > 0 && !isDataWorkload(s.workload) {
			m.CoreMsOp = m.MatchCPU * 1000 / float64(m.Ops)
		}
	}
	if maxR > 0 && len(results) > 1 {
		m.Spread = minR / maxR
	}
	return m, nil
}

// startWorker starts a worker process and hands it its task.
func startWorker(ctx context.Context, cfg *Config, t *task) (*worker, error) {
	cmd := exec.CommandContext(ctx, cfg.WorkerCmd[0], cfg.WorkerCmd[1:]...)
	cmd.Env = workerEnviron(cfg.WorkerEnv)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, stdin: stdin, stdout: bufio.NewReader(stdout), stderr: &lockedBuffer{}}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the worker %s: %w", cfg.WorkerCmd[0], err)
	}
	b, _ := json.Marshal(t)
	if _, err := stdin.Write(append(b, '\n')); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("send the task to a worker: %w", err)
	}
	return w, nil
}

// readLine decodes the next JSON line of a worker.
func readLine(w *worker, v any) error {
	line, err := w.stdout.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("worker %s exited early: %v: %s", strings.Join(w.cmd.Args, " "), err, strings.TrimSpace(w.stderr.String()))
	}
	return json.Unmarshal(line, v)
}
