package campaign

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestScheduleReplays: a schedule is a function of its seed and shape;
// every fault ends in time, no target has two faults at once, network
// faults hit proxied data servers only, and only the kinds asked for.
func TestScheduleReplays(t *testing.T) {
	shape := Shape{DataServers: 4, MetaServers: 2, Mounts: 2, Proxied: func(i int) bool { return i%2 == 0 }}
	d := 2 * time.Minute
	for _, kinds := range [][]Kind{AllKinds, {DataPartition, DataSlow}, {ClientKill}} {
		a := MakeSchedule(42, d, kinds, shape, 0.3)
		b := MakeSchedule(42, d, kinds, shape, 0.3)
		if a.String() != b.String() {
			t.Fatalf("seed 42 made two schedules:\n%s\n---\n%s", a, b)
		}
		if c := MakeSchedule(43, d, kinds, shape, 0.3); c.String() == a.String() {
			t.Errorf("seeds 42 and 43 made the same schedule:\n%s", a)
		}
		if len(a) < 5 {
			t.Errorf("only %d faults in %v:\n%s", len(a), d, a)
		}
		for i, f := range a {
			if f.End() > d || f.At < warmUp || f.For <= 0 {
				t.Errorf("fault %s outside the campaign's %v", f, d)
			}
			if !slices.Contains(kinds, f.Kind) {
				t.Errorf("fault %s of a kind not asked for", f)
			}
			if f.Kind.class() == "data" && f.Kind.network() && !shape.Proxied(f.Target) {
				t.Errorf("network fault %s on a data server without proxies", f)
			}
			if i > 0 && f.At < a[i-1].At {
				t.Errorf("fault %s before %s", f, a[i-1])
			}
			if busy(append(append(Schedule{}, a[:i]...), a[i+1:]...), f.Kind.class(), f.Target, f.At, f.End()) {
				t.Errorf("fault %s overlaps another fault of its target", f)
			}
		}
	}
	if s := MakeSchedule(1, d, []Kind{}, shape, 0); len(s) != 0 {
		t.Errorf("no kinds, yet faults:\n%s", s)
	}
}

func TestParseKinds(t *testing.T) {
	tests := []struct {
		in   string
		want []Kind
		err  bool
	}{
		{"all", AllKinds, false},
		{"none", []Kind{}, false},
		{"", []Kind{}, false},
		{"meta", []Kind{MetaKill, MetaStop, MetaPartition, MetaSlow}, false},
		{"client,-client-pause", []Kind{ClientKill, ClientStop}, false},
		{"data-kill, data-kill,meta-slow", []Kind{DataKill, MetaSlow}, false},
		{"data-explode", nil, true},
	}
	for _, tt := range tests {
		got, err := ParseKinds(tt.in)
		if (err != nil) != tt.err || !tt.err && !slices.Equal(got, tt.want) {
			t.Errorf("ParseKinds(%q) = %v, %v; want %v (error %v)", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// TestDataModelExplain: without a failure since the acknowledgement a
// file must hold exactly what its client wrote; after one, each byte
// may be its acknowledged value, a value written since or a zero past a
// truncation, and the length anything between the shortest and longest
// since; never anything else.
func TestDataModelExplain(t *testing.T) {
	base := func() *dataModel {
		m := &dataModel{}
		m.write(0, []byte("0123456789"))
		m.ack()
		return m
	}
	tests := []struct {
		name   string
		edit   func(m *dataModel)
		failed bool
		got    string
		ok     bool
	}{
		{"acknowledged, intact", func(m *dataModel) {}, false, "0123456789", true},
		{"acknowledged, a byte lost", func(m *dataModel) {}, false, "0123\x00\x00\x00789", false},
		{"write seen", func(m *dataModel) { m.write(2, []byte("ab")) }, false, "01ab456789", true},
		{"write not seen, no failure", func(m *dataModel) { m.write(2, []byte("ab")) }, false, "0123456789", false},
		{"write lost in a failure", func(m *dataModel) { m.write(2, []byte("ab")) }, true, "0123456789", true},
		{"half a write", func(m *dataModel) { m.write(2, []byte("ab")) }, true, "0a23456789", false},
		{"half a write, in order", func(m *dataModel) { m.write(2, []byte("ab")) }, true, "01a3456789", true},
		{"failed write may land", func(m *dataModel) { m.noteWriteAttempt(8, []byte("xyz")) }, true, "01234567xyz", true},
		{"too long", func(m *dataModel) { m.noteWriteAttempt(8, []byte("xyz")) }, true, "01234567xyz!", false},
		{"truncated and grown", func(m *dataModel) { m.truncate(4); m.write(6, []byte("q")) }, true, "0123\x00\x00q", true},
		{"zeros without a truncation", func(m *dataModel) { m.write(12, []byte("q")) }, true, "0123\x00\x00\x00789", false},
		{"hole before a write past the end", func(m *dataModel) { m.write(12, []byte("q")) }, true, "0123456789\x00\x00q", true},
		{"shorter than ever", func(m *dataModel) { m.truncate(6) }, true, "0123", false},
	}
	for _, tt := range tests {
		m := base()
		tt.edit(m)
		m.failed = tt.failed
		why := m.explain([]byte(tt.got))
		if (why == "") != tt.ok {
			t.Errorf("%s: explain(%q) = %q, want ok %v", tt.name, tt.got, why, tt.ok)
		}
	}
	// A write sent before a failure may land after the file was read
	// back and synced, for a while.
	late := base()
	late.noteWriteAttempt(2, []byte("zz"))
	late.failed = true
	late.adopt([]byte("0123456789"), time.Now().Add(time.Hour))
	if ok, _ := late.lateExplains(0, []byte("01zz456789"), late.cur); !ok {
		t.Error("a late write is not told")
	}
	if ok, _ := late.lateExplains(0, []byte("01zy456789"), late.cur); ok {
		t.Error("other bytes are taken for a late write")
	}
	late.write(3, []byte("Q"))
	late.ack()
	if ok, clobbered := late.lateExplains(0, []byte("01zz456789"), late.cur); !ok || !clobbered {
		t.Errorf("a late write over a byte written and acknowledged since: explained %v, clobbered %v", ok, clobbered)
	}
	late.lateUntil = time.Now().Add(-time.Second)
	if ok, _ := late.lateExplains(0, []byte("01zz456789"), late.cur); ok {
		t.Error("a late write explains bytes after its time")
	}

	var m dataModel // a creation never acknowledged
	m.write(0, []byte("abc"))
	m.failed = true
	for _, got := range []string{"", "abc", "a\x00c"} {
		if why := m.explain([]byte(got)); why != "" {
			t.Errorf("unacknowledged file holding %q: %s", got, why)
		}
	}
}

// TestNSModel: moving a directory moves what is below it; a pending
// operation locks its paths, what is below them and the directories
// above them.
func TestNSModel(t *testing.T) {
	m := newNSModel()
	for _, p := range []string{"a", "a/b", "c"} {
		m.entries[p] = &nsEntry{dir: true}
	}
	m.entries["a/b/f"] = &nsEntry{content: []byte("x")}
	m.entries["c/g"] = &nsEntry{}
	m.move("a", "c/a")
	var got []string
	for p := range m.entries {
		got = append(got, p)
	}
	slices.Sort(got)
	if want := []string{"", "c", "c/a", "c/a/b", "c/a/b/f", "c/g"}; !slices.Equal(got, want) {
		t.Fatalf("after moving a to c/a: %v, want %v", got, want)
	}
	if f, d := m.counts(); f != 2 || d != 3 {
		t.Errorf("counts %d files %d directories, want 2 and 3", f, d)
	}
	if c := m.children("c"); strings.Join(c, ",") != "a,g" {
		t.Errorf("children of c: %v", c)
	}
	m.pending = append(m.pending, &nsPending{op: "rename", from: "c/a/b", to: "c/z"})
	for p, want := range map[string]bool{"c/a/b/f": true, "c/a/b": true, "c/a": true, "c": true, "c/z": true, "c/g": false, "": false} {
		if m.locked(p) != want {
			t.Errorf("locked(%q) = %v, want %v", p, !want, want)
		}
	}
	if ds := m.dirs(); !slices.Contains(ds, "c") || slices.Contains(ds, "c/a/b") {
		t.Errorf("directories open for new names: %v", ds)
	}
}

// TestSpawner starts a daemon and runs a command through a spawner (a
// copy of the test binary).
func TestSpawner(t *testing.T) {
	sp, err := startSpawner()
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	out, errOut, code, err := sp.run(10*time.Second, []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, nil)
	if err != nil || out != "out\n" || errOut != "err\n" || code != 3 {
		t.Fatalf("run: %q %q %d %v", out, errOut, code, err)
	}
	log := t.TempDir() + "/d.log"
	pid, exit, err := sp.start([]string{"/bin/sh", "-c", "echo started; exec sleep 30"}, nil, log)
	if err != nil || pid <= 0 {
		t.Fatalf("start: %d %v", pid, err)
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case how := <-exit:
		if !strings.Contains(how, "killed") {
			t.Errorf("exit of a killed daemon: %q", how)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit reported for a killed daemon")
	}
	if _, _, _, err := sp.run(time.Second, []string{"/nonexistent/x"}, nil); err == nil {
		t.Error("running a missing program succeeded")
	}
}

// FuzzParseSpawnReq: any line is refused or gives a request with a
// program and bounded arguments.
func FuzzParseSpawnReq(f *testing.F) {
	f.Add([]byte(`{"id":1,"args":["/bin/true"],"env":["A=b"],"log":"/tmp/x.log"}`))
	f.Add([]byte(`{"id":2,"args":[],"timeout":-1}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := parseSpawnReq(line)
		if err != nil {
			return
		}
		if len(req.Args) == 0 || req.Args[0] == "" || len(req.Args)+len(req.Env) > maxSpawnArgs || req.Timeout < 0 {
			t.Fatalf("accepted %q as %+v", line, req)
		}
	})
}
