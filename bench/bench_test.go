package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// workerEnv makes the test binary act as a bench worker.
const workerEnv = "WEFT_BENCH_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		if err := WorkerMain(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testConfig is a tiny run on dirs whose workers are this test binary.
func testConfig(t *testing.T, dirs ...string) Config {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Targets:   dirs,
		Records:   []int64{8 << 10, 64 << 10},
		Procs:     []int{1, 2},
		Size:      256 << 10,
		Files:     10,
		TarFiles:  60,
		Cold:      "fadvise",
		CPUMatch:  "no-such-process-name-xyz",
		WorkerCmd: []string{exe},
		WorkerEnv: []string{workerEnv + "=1"},
	}
}

// TestRunEveryWorkload runs every workload on two local directories and
// checks each produced a positive rate on each.
func TestRunEveryWorkload(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	cfg := testConfig(t, a, b)
	var events int
	cfg.Progress = func(Progress) { events++ }
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range res.Measurements {
		seen[m.Workload] = true
		if m.Rate() <= 0 || m.Wall <= 0 || m.Ops <= 0 {
			t.Errorf("%s record %d procs %d on %s: rate %v wall %v ops %d, want positive", m.Workload, m.Record, m.Procs, m.Target, m.Rate(), m.Wall, m.Ops)
		}
		if len(m.Workers) != m.Procs {
			t.Errorf("%s: %d worker results for %d processes", m.Workload, len(m.Workers), m.Procs)
		}
		if isDataWorkload(m.Workload) && m.Bytes <= 0 {
			t.Errorf("%s moved no bytes", m.Workload)
		}
	}
	all := append(append([]string{}, dataWorkloads...), WSharedWrite, WFairRead, WUntar, WWalk, WTreeRemove)
	for _, w := range []string{WMdCreate, WMdStat, WMdRead, WMdSmallWrite, WMdSmallReadCold, WMdRemove, WMdMkdir, WMdRmdir} {
		all = append(all, w, w+"-shared")
	}
	for _, w := range all {
		if !seen[w] {
			t.Errorf("workload %s did not run", w)
		}
	}
	if events == 0 {
		t.Error("no progress reported")
	}
	for _, d := range []string{a, b} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s not cleaned up: %d entries left", d, len(ents))
		}
	}
	// Interleaving: every workload runs on A then B before the next.
	for i := 0; i+1 < len(res.Measurements); i += 2 {
		if res.Measurements[i].TargetIdx != 0 || res.Measurements[i+1].TargetIdx != 1 {
			t.Fatalf("measurements %d and %d are not A then B", i, i+1)
		}
	}
	rows := Summarize(res)
	var table bytes.Buffer
	if err := WriteTable(&table, res, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"seq-write", "md-create-shared", "tree-walk", "A/B"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

// TestWorkerErrors checks that a failing workload is reported with the
// worker's reason.
func TestWorkerErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	s := step{workload: WMdStat, procs: 1, tasks: func(target string) []task {
		return []task{{Kind: WMdStat, Path: filepath.Join(target, "missing"), Files: 1, Prefix: "f"}}
	}}
	_, err := runStep(context.Background(), &cfg, &s, dir)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("stat of a missing file: err %v, want ENOENT", err)
	}
	s.tasks = func(string) []task { return []task{{Kind: "bogus"}} }
	if _, err := runStep(context.Background(), &cfg, &s, dir); err == nil || !strings.Contains(err.Error(), "unknown workload") {
		t.Fatalf("unknown workload: err %v", err)
	}
}

// fakeResults are two targets, two repetitions of a few workloads.
func fakeResults() *Results {
	r := &Results{Started: time.Unix(0, 0).UTC(), Finished: time.Unix(60, 0).UTC(), Targets: []string{"/a", "/b<&>"},
		Records: []int64{8 << 10, 1 << 20}, Procs: []int{1, 4}, Size: 1 << 20, Files: 10, TarFiles: 10, Repeat: 2, CPUMatch: "weft"}
	add := func(w string, rec int64, procs, target int, rate float64) {
		for rep := 0; rep < 2; rep++ {
			v := rate * float64(1+rep) // medians: mean of rate and 2*rate
			m := Measurement{Workload: w, Target: r.Targets[target], TargetIdx: target, Record: rec, Procs: procs, Repeat: rep,
				Bytes: 1e6, Ops: 10, Wall: 1, MBps: v, OpsPerSec: v, CoreMsPerM: 1.5, Spread: 0.5}
			for i := 0; i < procs; i++ {
				m.Workers = append(m.Workers, WorkerMeasure{MBps: v / float64(procs), OpsPerSec: v / float64(procs)})
			}
			r.Measurements = append(r.Measurements, m)
		}
	}
	for _, rec := range r.Records {
		for _, p := range r.Procs {
			add(WSeqWrite, rec, p, 0, 100)
			add(WSeqWrite, rec, p, 1, 50)
		}
	}
	add(WFairRead, 1<<20, 4, 0, 80)
	add(WFairRead, 1<<20, 4, 1, 40)
	for _, p := range r.Procs {
		add(WMdCreate, 0, p, 0, 1000)
		add(WMdCreate, 0, p, 1, 3000)
	}
	return r
}

func TestSummarize(t *testing.T) {
	rows := Summarize(fakeResults())
	tests := []struct {
		workload string
		rec      int64
		procs    int
		rate     []float64
		ratio    []float64
	}{
		{WSeqWrite, 8 << 10, 1, []float64{100, 50}, []float64{1, 2}},
		{WSeqWrite, 1 << 20, 4, []float64{100, 50}, []float64{1, 2}},
		{WMdCreate, 0, 4, []float64{1000, 3000}, []float64{1, 1.0 / 3}},
	}
	for _, tc := range tests {
		var got *Row
		for i := range rows {
			if rows[i].Workload == tc.workload && rows[i].Record == tc.rec && rows[i].Procs == tc.procs {
				got = &rows[i]
			}
		}
		if got == nil {
			t.Errorf("%s %d %d: no row", tc.workload, tc.rec, tc.procs)
			continue
		}
		// The median of two repetitions (rate, 2*rate) is the lower one
		// for the rate of the median measurement.
		for i := range tc.rate {
			if got.Rate[i] != tc.rate[i] || got.Ratio[i] != tc.ratio[i] {
				t.Errorf("%s %d %d target %d: rate %v ratio %v, want %v %v", tc.workload, tc.rec, tc.procs, i, got.Rate[i], got.Ratio[i], tc.rate[i], tc.ratio[i])
			}
		}
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tc := range tests {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{512, "512B"}, {8 << 10, "8KiB"}, {256 << 10, "256KiB"}, {8 << 20, "8MiB"}, {1 << 30, "1GiB"}, {1536, "1536B"},
	}
	for _, tc := range tests {
		if got := FormatSize(tc.in); got != tc.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestWriteReport checks results.json decodes with every measurement, the
// SVG plots are well-formed XML and report.md links them.
func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	r := fakeResults()
	if err := WriteReport(dir, r); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Measurements []Measurement `json:"measurements"`
		Summary      []Row         `json:"summary"`
		Targets      []string      `json:"targets"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(got.Measurements) != len(r.Measurements) || len(got.Summary) == 0 || len(got.Targets) != 2 {
		t.Errorf("results.json: %d measurements, %d summary rows, %d targets", len(got.Measurements), len(got.Summary), len(got.Targets))
	}
	svgs, _ := filepath.Glob(filepath.Join(dir, "*.svg"))
	if len(svgs) == 0 {
		t.Fatal("no SVG plots written")
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, svg := range svgs {
		f, err := os.Open(svg)
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(f)
		root := ""
		for {
			tok, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s is not well-formed XML: %v", svg, err)
			}
			if se, ok := tok.(xml.StartElement); ok && root == "" {
				root = se.Name.Local
			}
		}
		f.Close()
		if root != "svg" {
			t.Errorf("%s: root element %q, want svg", svg, root)
		}
		if !bytes.Contains(md, []byte(filepath.Base(svg))) {
			t.Errorf("report.md does not link %s", filepath.Base(svg))
		}
	}
	for _, want := range []string{"seq-write", "Fairness", "/b<&>"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

// TestTarball checks the generated tarball unpacks into the number of
// files asked for.
func TestTarball(t *testing.T) {
	tb, err := makeTarball(300, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := extract(tb, dir, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	files := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files++
		}
		return nil
	})
	if files != 300 {
		t.Errorf("unpacked %d files, want 300", files)
	}
}
