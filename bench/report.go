package bench

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// reportJSON is the layout of results.json.
type reportJSON struct {
	*Results
	Summary []Row `json:"summary"`
}

// WriteReport writes results.json (every measurement and the summary),
// report.md (the tables and links to the plots) and SVG plots of
// throughput against record size and against process count into dir.
func WriteReport(dir string, r *Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create the report directory: %w", err)
	}
	rows := Summarize(r)
	b, err := json.MarshalIndent(reportJSON{Results: r, Summary: rows}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	plots, err := writePlots(dir, r, rows)
	if err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# weft bench report\n\n")
	fmt.Fprintf(&md, "Run %s to %s. Size per process %s, record sizes %s, process counts %v, %d metadata entries per process, tarball of %d files, %d repetition(s) (medians), cold reads: %s.\n\n",
		r.Started.Format("2006-01-02 15:04:05 UTC"), r.Finished.Format("15:04:05 UTC"), FormatSize(r.Size), sizesList(r.Records), r.Procs, r.Files, r.TarFiles, r.Repeat, r.Cold)
	md.WriteString("```\n")
	if err := WriteTable(&md, r, rows); err != nil {
		return err
	}
	md.WriteString("```\n\n")
	if r.CPUMatch != "" {
		md.WriteString("## Processes matching the CPU pattern\n\n")
		names := targetNames(len(r.Targets))
		for i, t := range r.Targets {
			peak, cpu, perMB := matchTotals(r, i)
			fmt.Fprintf(&md, "- %s (%s): peak RSS %.1f MiB, %.1f CPU seconds in all, %.2f core-ms per MB moved overall\n", names[i], t, float64(peak)/(1<<20), cpu, perMB)
		}
		md.WriteString("\n")
	}
	if fair := fairness(r, rows); fair != "" {
		md.WriteString("## Fairness (per-client MB/s)\n\n" + fair + "\n")
	}
	if len(plots) > 0 {
		md.WriteString("## Plots\n\n")
		for _, p := range plots {
			fmt.Fprintf(&md, "![%s](%s)\n\n", p.title, p.file)
		}
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(md.String()), 0o644)
}

// matchTotals sums what the processes matching the CPU pattern did while
// target i ran: their largest peak RSS, CPU seconds and core-ms per MB.
func matchTotals(r *Results, i int) (peak int64, cpu, perMB float64) {
	var mb float64
	for _, m := range r.Measurements {
		if m.TargetIdx == i {
			peak = max(peak, m.PeakRSS)
			cpu += m.MatchCPU
			mb += float64(m.Bytes) / 1e6
		}
	}
	if mb > 0 {
		perMB = cpu * 1000 / mb
	}
	return peak, cpu, perMB
}

// fairness lists each client's rate of the fairness workload per target.
func fairness(r *Results, rows []Row) string {
	var b strings.Builder
	names := targetNames(len(r.Targets))
	for _, row := range rows {
		if row.Workload != WFairRead {
			continue
		}
		for i, ws := range row.Workers {
			var parts []string
			for _, v := range ws {
				parts = append(parts, formatRate(v))
			}
			fmt.Fprintf(&b, "- %s (%s), %d readers: %s MB/s; spread %.2f\n", names[i], r.Targets[i], row.Procs, strings.Join(parts, ", "), row.Spread[i])
		}
	}
	return b.String()
}

func sizesList(s []int64) string {
	var out []string
	for _, v := range s {
		out = append(out, FormatSize(v))
	}
	return strings.Join(out, ", ")
}

// plot is one written SVG file.
type plot struct{ title, file string }

// writePlots draws, for every data workload, throughput against record size
// (at the smallest process count) and against process count (at each
// record size), one line per target; and metadata rates against process
// count.
func writePlots(dir string, r *Results, rows []Row) ([]plot, error) {
	var plots []plot
	find := func(w string, rec int64, p int) *Row {
		for i := range rows {
			if rows[i].Workload == w && rows[i].Record == rec && rows[i].Procs == p {
				return &rows[i]
			}
		}
		return nil
	}
	var workloads []string
	for _, row := range rows {
		if !slices.Contains(workloads, row.Workload) {
			workloads = append(workloads, row.Workload)
		}
	}
	names := targetNames(len(r.Targets))
	legend := make([]string, len(names))
	for i := range names {
		legend[i] = names[i] + " " + r.Targets[i]
	}
	emit := func(title, file, xlabel, unit string, xs []string, get func(x int) *Row) error {
		series := make([][]float64, len(r.Targets))
		any := false
		for t := range series {
			series[t] = make([]float64, len(xs))
			for x := range xs {
				if row := get(x); row != nil {
					series[t][x] = row.Rate[t]
					any = true
				} else {
					series[t][x] = math.NaN()
				}
			}
		}
		if !any || len(xs) < 2 {
			return nil
		}
		svg := lineChart(title, xlabel, unit, xs, legend, series)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(svg), 0o644); err != nil {
			return err
		}
		plots = append(plots, plot{title, file})
		return nil
	}
	procLabels := make([]string, len(r.Procs))
	for i, p := range r.Procs {
		procLabels[i] = fmt.Sprint(p)
	}
	for _, w := range workloads {
		if isDataWorkload(w) && w != WUntar && w != WFairRead {
			recLabels := make([]string, len(r.Records))
			for i, rec := range r.Records {
				recLabels[i] = FormatSize(rec)
			}
			for _, p := range r.Procs {
				if err := emit(fmt.Sprintf("%s, %d process(es): MB/s by record size", w, p), fmt.Sprintf("%s-by-record-p%d.svg", w, p), "record size", "MB/s", recLabels,
					func(x int) *Row { return find(w, r.Records[x], p) }); err != nil {
					return nil, err
				}
			}
			for _, rec := range r.Records {
				if err := emit(fmt.Sprintf("%s, %s records: MB/s by process count", w, FormatSize(rec)), fmt.Sprintf("%s-by-procs-%s.svg", w, FormatSize(rec)), "processes", "MB/s", procLabels,
					func(x int) *Row { return find(w, rec, r.Procs[x]) }); err != nil {
					return nil, err
				}
			}
		} else if strings.HasPrefix(w, "md-") {
			if err := emit(fmt.Sprintf("%s: ops/s by process count", w), fmt.Sprintf("%s-by-procs.svg", w), "processes", "ops/s", procLabels,
				func(x int) *Row { return find(w, 0, r.Procs[x]) }); err != nil {
				return nil, err
			}
		}
	}
	return plots, nil
}

// palette colours the targets' lines.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// lineChart draws series (one per target, NaN for a missing point) over
// the categorical x axis xs as a standalone SVG document.
func lineChart(title, xlabel, unit string, xs, legend []string, series [][]float64) string {
	const w, left, right, top = 640.0, 70.0, 20.0, 40.0
	bottom := 60 + 14*float64(len(series))
	h := 270 + top + bottom
	pw, ph := w-left-right, h-top-bottom
	ymax := 0.0
	for _, s := range series {
		for _, v := range s {
			if !math.IsNaN(v) {
				ymax = math.Max(ymax, v)
			}
		}
	}
	ymax = niceCeil(ymax)
	xAt := func(i int) float64 {
		if len(xs) == 1 {
			return left + pw/2
		}
		return left + pw*float64(i)/float64(len(xs)-1)
	}
	yAt := func(v float64) float64 { return top + ph - ph*v/ymax }
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="22" text-anchor="middle" font-size="14">%s</text>`+"\n", w/2, html.EscapeString(title))
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
		y := yAt(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+pw, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, html.EscapeString(formatRate(v)))
	}
	for i, x := range xs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", xAt(i), top+ph+18, html.EscapeString(x))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", left+pw/2, top+ph+36, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", top+ph/2, top+ph/2, html.EscapeString(unit))
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	for t, s := range series {
		col := palette[t%len(palette)]
		var pts []string
		for i, v := range s {
			if math.IsNaN(v) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xAt(i), yAt(v)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xAt(i), yAt(v), col)
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), col)
		}
		ly := top + ph + 52 + float64(t)*14
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", left, ly-4, left+20, ly-4, col)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", left+26, ly, html.EscapeString(legend[t]))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v <= 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
