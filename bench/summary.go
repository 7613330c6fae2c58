package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Row is one workload configuration (workload, record size, procs) with
// the median of its repetitions on every target.
type Row struct {
	Workload string      `json:"workload"`
	Record   int64       `json:"record_bytes,omitempty"`
	Procs    int         `json:"procs"`
	Unit     string      `json:"unit"`
	Rate     []float64   `json:"rate"`            // per target, median
	CoreMsMB []float64   `json:"core_ms_per_mb"`  // per target, median (0: not measured)
	Spread   []float64   `json:"spread"`          // per target, median slowest/fastest (fairness)
	Ratio    []float64   `json:"first_over_this"` // per target, Rate of the first target / Rate
	Workers  [][]float64 `json:"worker_rates"`    // per target, per worker rates of the median repetition
}

// Summarize groups the measurements of r into rows, in the order they ran,
// with medians over repetitions.
func Summarize(r *Results) []Row {
	type key struct {
		w   string
		rec int64
		p   int
	}
	var order []key
	groups := map[key][][]Measurement{}
	for _, m := range r.Measurements {
		k := key{m.Workload, m.Record, m.Procs}
		g, ok := groups[k]
		if !ok {
			order = append(order, k)
			g = make([][]Measurement, len(r.Targets))
		}
		g[m.TargetIdx] = append(g[m.TargetIdx], m)
		groups[k] = g
	}
	var rows []Row
	for _, k := range order {
		g := groups[k]
		row := Row{Workload: k.w, Record: k.rec, Procs: k.p, Unit: "ops/s"}
		if isDataWorkload(k.w) {
			row.Unit = "MB/s"
		}
		for _, ms := range g {
			rate, cpu, spread := 0.0, 0.0, 0.0
			var workers []float64
			if len(ms) > 0 {
				med := medianBy(ms, func(m Measurement) float64 { return m.Rate() })
				rate = med.Rate()
				cpu = median(mapf(ms, func(m Measurement) float64 {
					if isDataWorkload(m.Workload) {
						return m.CoreMsPerM
					}
					return m.CoreMsOp
				}))
				spread = median(mapf(ms, func(m Measurement) float64 { return m.Spread }))
				for _, w := range med.Workers {
					if row.Unit == "MB/s" {
						workers = append(workers, w.MBps)
					} else {
						workers = append(workers, w.OpsPerSec)
					}
				}
			}
			row.Rate = append(row.Rate, rate)
			row.CoreMsMB = append(row.CoreMsMB, cpu)
			row.Spread = append(row.Spread, spread)
			row.Workers = append(row.Workers, workers)
		}
		for _, v := range row.Rate {
			ratio := 0.0
			if v > 0 {
				ratio = row.Rate[0] / v
			}
			row.Ratio = append(row.Ratio, ratio)
		}
		rows = append(rows, row)
	}
	return rows
}

func mapf(ms []Measurement, f func(Measurement) float64) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = f(m)
	}
	return out
}

// median of vs (mean of the middle two for an even count).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianBy returns the measurement with the median value of f (the lower
// middle one for an even count).
func medianBy(ms []Measurement, f func(Measurement) float64) Measurement {
	s := slices.Clone(ms)
	slices.SortFunc(s, func(a, b Measurement) int {
		switch fa, fb := f(a), f(b); {
		case fa < fb:
			return -1
		case fa > fb:
			return 1
		}
		return 0
	})
	return s[(len(s)-1)/2]
}

// FormatSize prints a byte count the short way: 8KiB, 256KiB, 8MiB.
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// formatRate prints a rate with three significant digits or so.
func formatRate(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// targetNames are short column names: A, B, C... with the directories
// listed under the table.
func targetNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = string(rune('A' + i%26))
		if i >= 26 {
			out[i] += fmt.Sprint(i / 26)
		}
	}
	return out
}

// WriteTable prints the rows as an aligned text table: the rate on each
// target, ratios against the first, CPU cost of the matched processes and
// fairness spread when measured.
func WriteTable(w io.Writer, r *Results, rows []Row) error {
	names := targetNames(len(r.Targets))
	for i, t := range r.Targets {
		fmt.Fprintf(w, "%s = %s\n", names[i], t)
	}
	if r.Repeat > 1 {
		fmt.Fprintf(w, "medians of %d repetitions\n", r.Repeat)
	}
	fmt.Fprintln(w)
	hasCPU := r.CPUMatch != ""
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	wname := len("workload")
	for _, row := range rows {
		wname = max(wname, len(row.Workload))
	}
	hdr := []string{fmt.Sprintf("%-*s", wname, "workload"), "record", "procs", "unit"}
	hdr = append(hdr, names...)
	for _, n := range names[1:] {
		hdr = append(hdr, names[0]+"/"+n)
	}
	if hasCPU {
		for _, n := range names {
			hdr = append(hdr, "cpu "+n)
		}
	}
	hdr = append(hdr, "spread")
	fmt.Fprintln(tw, strings.Join(hdr, "\t")+"\t")
	for _, row := range rows {
		rec := ""
		if row.Record > 0 {
			rec = FormatSize(row.Record)
		}
		cells := []string{fmt.Sprintf("%-*s", wname, row.Workload), rec, fmt.Sprint(row.Procs), row.Unit}
		for _, v := range row.Rate {
			cells = append(cells, formatRate(v))
		}
		for _, v := range row.Ratio[1:] {
			if v > 0 {
				cells = append(cells, fmt.Sprintf("%.2f", v))
			} else {
				cells = append(cells, "-")
			}
		}
		if hasCPU {
			for _, v := range row.CoreMsMB {
				cells = append(cells, formatRate(v))
			}
		}
		var sp []string
		for _, v := range row.Spread {
			if v > 0 {
				sp = append(sp, fmt.Sprintf("%.2f", v))
			}
		}
		cells = append(cells, strings.Join(sp, "/"))
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(names) > 1 {
		fmt.Fprintf(w, "\n%s/X: the rate on %s divided by the rate on X (above 1: %s is faster)\n", names[0], names[0], names[0])
	}
	if hasCPU {
		var parts []string
		for i := range r.Targets {
			peak, _, perMB := matchTotals(r, i)
			parts = append(parts, fmt.Sprintf("%s %.0f MiB peak RSS, %.2f core-ms/MB overall", names[i], float64(peak)/(1<<20), perMB))
		}
		fmt.Fprintf(w, "processes matching %q: %s\n", r.CPUMatch, strings.Join(parts, "; "))
		fmt.Fprintf(w, "cpu X: core-ms per MB moved (ops/s rows: per operation) by the processes matching %q while X ran\n", r.CPUMatch)
	}
	fmt.Fprintln(w, "spread: slowest/fastest worker rate (1.00 = perfectly fair)")
	return nil
}
