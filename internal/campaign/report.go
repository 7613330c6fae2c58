package campaign

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Finding is something the campaign saw that the contract forbids.
type Finding struct {
	At   time.Time
	What string
}

// opErr is a failed operation of a workload.
type opErr struct {
	who, op    string
	start, end time.Time
	err        error
}

// window is when a fault was in force: from its injection to the end of
// its healing (a restarted process listening again, a network restored,
// a new mount).
type window struct {
	f          Fault
	start, end time.Time // end is zero while in force
}

// recorder collects what the campaign saw: operations, their errors,
// fault windows and findings. Safe for concurrent use.
type recorder struct {
	mu       sync.Mutex
	ops      map[string]int // successful operations by kind
	errs     []opErr
	windows  []*window
	findings []Finding
	notes    map[string]int
	logf     func(string, ...any)
}

func newRecorder(logf func(string, ...any)) *recorder {
	return &recorder{ops: map[string]int{}, notes: map[string]int{}, logf: logf}
}

// done records the end of an operation that started at start.
func (r *recorder) done(who, op string, start time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.ops[op]++
		return
	}
	r.errs = append(r.errs, opErr{who: who, op: op, start: start, end: time.Now(), err: err})
}

// find records a finding and logs it at once.
func (r *recorder) find(format string, args ...any) {
	f := Finding{At: time.Now(), What: fmt.Sprintf(format, args...)}
	r.mu.Lock()
	r.findings = append(r.findings, f)
	r.mu.Unlock()
	r.logf("FINDING %s: %s", f.At.Format("15:04:05.000"), f.What)
}

// note records something allowed but worth counting (a late write), and
// logs it.
func (r *recorder) note(format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.notes[what]++
	first := r.notes[what] == 1
	r.mu.Unlock()
	if first {
		r.logf("note %s: %s", time.Now().Format("15:04:05.000"), what)
	}
}

// open records a fault's injection and returns its window.
func (r *recorder) open(f Fault) *window {
	w := &window{f: f, start: time.Now()}
	r.mu.Lock()
	r.windows = append(r.windows, w)
	r.mu.Unlock()
	return w
}

// close records the end of w's healing.
func (r *recorder) close(w *window) {
	r.mu.Lock()
	w.end = time.Now()
	r.mu.Unlock()
}

// excused reports whether an operation from start to end overlapped a
// fault window or its recovery bound.
func (r *recorder) excused(start, end time.Time, bound time.Duration) (*window, bool) {
	for _, w := range r.windows {
		wend := w.end
		if wend.IsZero() {
			wend = end // still in force
		}
		if !start.After(wend.Add(bound)) && !end.Before(w.start) {
			return w, true
		}
	}
	return nil, false
}

// judgeErrors turns every error outside the fault windows and their
// recovery bound into a finding, and returns how many errors each fault
// kind excused.
func (r *recorder) judgeErrors(bound time.Duration) map[Kind]int {
	r.mu.Lock()
	errs := append([]opErr(nil), r.errs...)
	r.mu.Unlock()
	excused := map[Kind]int{}
	for _, e := range errs {
		r.mu.Lock()
		w, ok := r.excused(e.start, e.end, bound)
		r.mu.Unlock()
		if ok {
			excused[w.f.Kind]++
			continue
		}
		r.find("%s: %s failed at %s (started %s), more than %v after every fault had ended: %v",
			e.who, e.op, e.end.Format("15:04:05.000"), e.start.Format("15:04:05.000"), bound, e.err)
	}
	return excused
}

// summary describes the operations and errors.
func (r *recorder) summary(excused map[Kind]int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []string
	total := 0
	for op, n := range r.ops {
		ops = append(ops, fmt.Sprintf("%s %d", op, n))
		total += n
	}
	sort.Strings(ops)
	var exc []string
	for k, n := range excused {
		exc = append(exc, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(exc)
	notes := 0
	for _, n := range r.notes {
		notes += n
	}
	return fmt.Sprintf("%d operations succeeded (%s); %d failed, excused by the fault in force: %s; %d late writes",
		total, strings.Join(ops, ", "), len(r.errs), strings.Join(exc, ", "), notes)
}

// Findings returns the findings so far.
func (r *recorder) Findings() []Finding {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Finding(nil), r.findings...)
}

// sampleErrors lists up to n errors (the first ones of each worker and
// operation), for the report.
func (r *recorder) sampleErrors(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, e := range r.errs {
		k := e.who + " " + e.op
		if seen[k] || len(out) >= n {
			continue
		}
		seen[k] = true
		out = append(out, fmt.Sprintf("%s %s: %s: %v", e.end.Format("15:04:05.000"), e.who, e.op, e.err))
	}
	return out
}
