package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/testcluster"
)

// The lock tests run real `weft mount` processes on one cluster and lock
// files from separate processes (POSIX locks belong to a process): copies
// of this test binary started as lock holders (lockHelperMain), python3
// for SQLite and for an interrupted wait.

func init() {
	if os.Getenv("WEFT_LOCK_HELPER") == "1" {
		lockHelperMain()
		os.Exit(0)
	}
}

// lockHelperMain is a lock holder: it reads one command a line from stdin
// and answers one line on stdout ("ok", "err <errno>", or a result):
//
//	open PATH | close | pid
//	flock sh|ex|un [nb]
//	lk rd|wr|un START LEN [w]      F_SETLK, or F_SETLKW with w
//	getlk rd|wr START LEN          answers "TYPE PID START LEN"
func lockHelperMain() {
	var f *os.File
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		args := strings.Fields(in.Text())
		if len(args) == 0 {
			continue
		}
		reply := "ok"
		var err error
		switch args[0] {
		case "open":
			f, err = os.OpenFile(args[1], os.O_RDWR|os.O_CREATE, 0o644)
		case "close":
			err = f.Close()
		case "pid":
			reply = strconv.Itoa(os.Getpid())
		case "flock":
			how := map[string]int{"sh": syscall.LOCK_SH, "ex": syscall.LOCK_EX, "un": syscall.LOCK_UN}[args[1]]
			if len(args) > 2 {
				how |= syscall.LOCK_NB
			}
			err = syscall.Flock(int(f.Fd()), how)
		case "lk", "getlk":
			lk := syscall.Flock_t{Type: map[string]int16{"rd": syscall.F_RDLCK, "wr": syscall.F_WRLCK, "un": syscall.F_UNLCK}[args[1]], Whence: 0}
			lk.Start, _ = strconv.ParseInt(args[2], 10, 64)
			lk.Len, _ = strconv.ParseInt(args[3], 10, 64)
			cmd := syscall.F_SETLK
			switch {
			case args[0] == "getlk":
				cmd = syscall.F_GETLK
			case len(args) > 4:
				cmd = syscall.F_SETLKW
			}
			if err = syscall.FcntlFlock(f.Fd(), cmd, &lk); err == nil && cmd == syscall.F_GETLK {
				reply = fmt.Sprintf("%s %d %d %d", map[int16]string{syscall.F_RDLCK: "rd", syscall.F_WRLCK: "wr", syscall.F_UNLCK: "un"}[lk.Type], lk.Pid, lk.Start, lk.Len)
			}
		default:
			reply = "unknown command " + args[0]
		}
		if err != nil {
			var en syscall.Errno
			if e, ok := err.(*os.PathError); ok {
				err = e.Err
			}
			en, _ = err.(syscall.Errno)
			reply = fmt.Sprintf("err %d %v", int(en), err)
		}
		fmt.Println(reply)
	}
}

// lockProc is a running lock holder.
type lockProc struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	pid   int
}

func startLockProc(t *testing.T, name string) *lockProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &lockProc{t: t, name: name, cmd: exec.Command(exe), lines: make(chan string, 16)}
	p.cmd.Env = append(os.Environ(), "WEFT_LOCK_HELPER=1")
	p.cmd.Stderr = os.Stderr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.pid = p.cmd.Process.Pid
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
	return p
}

// send writes a command without waiting for its answer.
func (p *lockProc) send(cmd string) {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		p.t.Fatalf("%s: send %q: %v", p.name, cmd, err)
	}
}

// answer waits for the next answer.
func (p *lockProc) answer(what string) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("%s exited waiting for the answer to %s", p.name, what)
		}
		return l
	case <-time.After(failWait):
		p.t.Fatalf("%s: no answer to %s after %v", p.name, what, failWait)
	}
	return ""
}

// noAnswer checks that no answer comes within a while (a waiting lock).
func (p *lockProc) noAnswer(what string) {
	p.t.Helper()
	select {
	case l := <-p.lines:
		p.t.Fatalf("%s: %s answered %q, want it still waiting", p.name, what, l)
	case <-time.After(300 * time.Millisecond):
	}
}

// do runs a command and returns its answer.
func (p *lockProc) do(cmd string) string {
	p.t.Helper()
	p.send(cmd)
	return p.answer(cmd)
}

// must runs a command that must answer ok.
func (p *lockProc) must(cmd string) {
	p.t.Helper()
	if got := p.do(cmd); got != "ok" {
		p.t.Fatalf("%s: %s: %s", p.name, cmd, got)
	}
}

// busy runs a command that must fail with EAGAIN (EWOULDBLOCK).
func (p *lockProc) busy(cmd string) {
	p.t.Helper()
	if got := p.do(cmd); !strings.HasPrefix(got, fmt.Sprintf("err %d ", int(syscall.EAGAIN))) {
		p.t.Fatalf("%s: %s: %s, want EAGAIN", p.name, cmd, got)
	}
}

// eventually retries a command until it answers ok: locks released by
// FUSE release, which the kernel sends after close(2) returns.
func (p *lockProc) eventually(cmd string) {
	p.t.Helper()
	deadline := time.Now().Add(failWait)
	for {
		got := p.do(cmd)
		if got == "ok" {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: %s still answers %s after %v", p.name, cmd, got, failWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockMount runs weft mount on a new directory of c and returns it with
// its process.
func lockMount(c *failCluster, extra ...string) (string, *testcluster.Proc) {
	c.t.Helper()
	c.mounts++
	mnt := filepath.Join(c.base, fmt.Sprintf("mnt%d", c.mounts))
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		c.t.Fatal(err)
	}
	d := c.start(fmt.Sprintf("mount%d", c.mounts), append(append([]string{"mount", "--meta", c.metaAddr}, extra...), mnt)...)
	c.t.Cleanup(func() { c.unmount(d, mnt) })
	c.waitFor("the mount on "+mnt, 30*time.Second, func() bool { return isMounted(mnt) || !d.Running() })
	if !d.Running() {
		c.t.Fatalf("weft mount exited: %v", d.Err())
	}
	return mnt, d
}

// TestLocksAcrossMounts: flock and fcntl locks taken through one mount
// hold against processes on another mount; F_GETLK reports the holder's
// pid; F_SETLKW waits and is granted on unlock; close releases POSIX
// locks and the last close flock locks; a signal interrupts a waiting
// F_SETLKW.
func TestLocksAcrossMounts(t *testing.T) {
	c := newFailCluster(t, 1, nil, nil)
	m1, _ := lockMount(c)
	m2, _ := lockMount(c)
	p1, p2 := startLockProc(t, "p1"), startLockProc(t, "p2")

	t.Run("flock", func(t *testing.T) {
		p1.t, p2.t = t, t
		p1.must("open " + filepath.Join(m1, "flocked"))
		p2.must("open " + filepath.Join(m2, "flocked"))
		p1.must("flock ex nb")
		p2.busy("flock ex nb")
		p2.busy("flock sh nb")
		p1.must("flock sh nb") // conversion
		p2.must("flock sh nb")
		p2.must("flock un")
		p1.must("flock un")
		p2.must("flock ex nb")
		p1.busy("flock sh nb")
		// Waiting flock, granted when the holder's file is closed.
		p1.send("flock ex")
		p1.noAnswer("flock ex")
		p2.must("close")
		if got := p1.answer("flock ex"); got != "ok" {
			t.Fatalf("waiting flock: %s", got)
		}
		p1.must("close")
		p2.must("open " + filepath.Join(m2, "flocked"))
		p2.eventually("flock ex nb")
		p2.must("close")
	})

	t.Run("fcntl", func(t *testing.T) {
		p1.t, p2.t = t, t
		p1.must("open " + filepath.Join(m1, "ranged"))
		p2.must("open " + filepath.Join(m2, "ranged"))
		p1.must("lk wr 0 100")
		p2.busy("lk rd 50 10")
		if got, want := p2.do("getlk wr 0 0"), fmt.Sprintf("wr %d 0 100", p1.pid); got != want {
			t.Fatalf("F_GETLK through the other mount: %q, want %q", got, want)
		}
		p2.must("lk rd 100 10")
		if got, want := p1.do("getlk wr 100 1"), fmt.Sprintf("rd %d 100 10", p2.pid); got != want {
			t.Fatalf("F_GETLK: %q, want %q", got, want)
		}
		p1.must("lk rd 200 0")   // read lock to EOF: shares with p2's read lock at 100..109
		p2.busy("lk wr 300 1")   // in p1's read lock to EOF
		p1.must("lk un 50 1000") // unlock part of the range; p1 keeps 0..49
		p2.must("lk wr 300 1")
		p2.busy("lk wr 49 2")
		if got := p1.do("getlk wr 50 50"); !strings.HasPrefix(got, "un ") {
			t.Fatalf("F_GETLK of a free range: %q, want unlocked", got)
		}

		// F_SETLKW waits until the holder unlocks.
		p2.send("lk wr 0 10 w")
		p2.noAnswer("F_SETLKW")
		p1.must("lk un 0 0")
		if got := p2.answer("F_SETLKW"); got != "ok" {
			t.Fatalf("F_SETLKW after unlock: %s", got)
		}
		// close(2) releases the process's POSIX locks at once.
		p1.busy("lk wr 5 1")
		p2.must("close")
		p1.must("lk wr 0 0")
		p1.must("close")
	})

	t.Run("interrupted wait", func(t *testing.T) {
		p1.t = t
		py := needPython(t)
		p1.must("open " + filepath.Join(m1, "intr"))
		p1.must("lk wr 0 0")
		script := `
import fcntl, os, signal, sys
class Interrupted(Exception): pass
def handler(sig, frame): raise Interrupted()
signal.signal(signal.SIGALRM, handler)
fd = os.open(sys.argv[1], os.O_RDWR)
signal.setitimer(signal.ITIMER_REAL, 0.5)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
    print("granted")
except Interrupted:
    print("interrupted")
`
		out, err := exec.Command(py, "-c", script, filepath.Join(m2, "intr")).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "interrupted" {
			t.Fatalf("F_SETLKW interrupted by a signal: %s (%v), want interrupted", out, err)
		}
		// The interrupted waiter took nothing: after the unlock, another
		// process on that mount finds the range free.
		p1.must("lk un 0 0")
		p2.t = t
		p2.must("open " + filepath.Join(m2, "intr"))
		p2.must("lk wr 0 10")
		p2.must("close")
		p1.must("close")
	})
}

// needPython returns python3 with its sqlite3 module, or skips (fails in
// CI, which installs it).
func needPython(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(py, "-c", "import sqlite3, fcntl").Run()
	}
	if err != nil {
		msg := fmt.Sprintf("python3 with sqlite3 is needed (apt-get install python3): %v", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// TestSQLiteTwoMounts: two processes on two mounts insert into one SQLite
// database (rollback journal, POSIX locks) at the same time; every row is
// there at the end and the database passes its integrity check.
// TestSQLiteNextToNewFiles creates a database in a directory where files
// were just made (under a create delegation, not sent to the meta service
// yet): SQLite's first lock must find its file (it failed with "disk I/O
// error": F_SETLK answered ENOENT).
func TestSQLiteNextToNewFiles(t *testing.T) {
	py := needPython(t)
	c := newFailCluster(t, 1, nil, nil)
	m, _ := lockMount(c)
	dir := filepath.Join(m, "fresh")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := `
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("create table t (v)")
db.execute("insert into t values (1)")
db.commit()
print(db.execute("select count(*) from t").fetchone()[0])
`
	out, err := exec.Command(py, "-c", script, filepath.Join(dir, "new.db")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("sqlite next to files just made: %v\n%s", err, out)
	}
}

func TestSQLiteTwoMounts(t *testing.T) {
	py := needPython(t)
	c := newFailCluster(t, 1, nil, nil)
	m1, _ := lockMount(c)
	m2, _ := lockMount(c)
	const rows = 60
	setup := `
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("create table t (writer text, n integer, pad text, primary key (writer, n))")
db.commit()
`
	if out, err := exec.Command(py, "-c", setup, filepath.Join(m1, "db.sqlite")).CombinedOutput(); err != nil {
		t.Fatalf("create the database: %v\n%s", err, out)
	}
	writer := `
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=120)
name, rows = sys.argv[2], int(sys.argv[3])
start = time.time()
for i in range(rows):
    db.execute("insert into t values (?, ?, ?)", (name, i, name * 200))
    db.commit()
print("%s: %d rows in %.2f s" % (name, rows, time.time() - start))
`
	start := time.Now()
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for i, m := range []string{m1, m2} {
		cmd := exec.Command(py, "-c", writer, filepath.Join(m, "db.sqlite"), fmt.Sprintf("w%d", i), strconv.Itoa(rows))
		out := new(strings.Builder)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("writer %d: %v\n%s", i, err, outs[i])
		}
		t.Logf("%s", strings.TrimSpace(outs[i].String()))
	}
	t.Logf("%d rows from two mounts in %v", 2*rows, time.Since(start).Round(time.Millisecond))
	check := `
import sqlite3, sys, json
db = sqlite3.connect(sys.argv[1])
counts = dict(db.execute("select writer, count(distinct n) from t group by writer").fetchall())
print(json.dumps({"integrity": db.execute("pragma integrity_check").fetchone()[0], "counts": counts}))
`
	for _, m := range []string{m1, m2} {
		out, err := exec.Command(py, "-c", check, filepath.Join(m, "db.sqlite")).CombinedOutput()
		if err != nil {
			t.Fatalf("check the database through %s: %v\n%s", m, err, out)
		}
		var res struct {
			Integrity string         `json:"integrity"`
			Counts    map[string]int `json:"counts"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("check output %q: %v", out, err)
		}
		if res.Integrity != "ok" || res.Counts["w0"] != rows || res.Counts["w1"] != rows {
			t.Fatalf("through %s: integrity %q, rows %v; want ok and %d rows of each writer", m, res.Integrity, res.Counts, rows)
		}
	}
}

// TestLockHolderMountKilled: a mount killed with SIGKILL while a process
// on it holds a POSIX lock and a flock lock and has an unlinked file open:
// after the session lease, a waiter on the other mount gets the locks and
// the unlinked file's data is deleted; weft status lists the clients.
func TestLockHolderMountKilled(t *testing.T) {
	const lease = 2 * time.Second
	c := newFailCluster(t, 1, []string{"--session-lease", lease.String()}, nil)
	m1, d1 := lockMount(c)
	m2, _ := lockMount(c)
	p1, p2 := startLockProc(t, "p1"), startLockProc(t, "p2")
	p1.must("open " + filepath.Join(m1, "victim"))
	p1.must("lk wr 0 0")
	p1.must("flock ex nb")
	orphan := startLockProc(t, "orphan")
	orphan.must("open " + filepath.Join(m1, "orphan"))
	if err := os.WriteFile(filepath.Join(m1, "orphan"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(m1, "orphan")); err != nil {
		t.Fatal(err)
	}

	if n := dirBytes(c.data[0].dir); n < 1<<20 {
		t.Fatalf("the data server holds %d bytes, want the unlinked file's 1 MiB", n)
	}
	st, err := c.status()
	if err != nil {
		t.Fatal(err)
	}
	var sawLocks bool
	for _, s := range st.GetSessionList() {
		if s.GetMountPoint() == m1 {
			sawLocks = s.GetLocks() == 2 && s.GetOpenFiles() == 2
			if !sawLocks {
				t.Fatalf("session of %s: %+v; want 2 locks and 2 open files", m1, s)
			}
		}
	}
	if !sawLocks || len(st.GetSessionList()) != 2 {
		t.Fatalf("status lists sessions %+v; want both mounts", st.GetSessionList())
	}
	code, out, errOut := runWeft(t, "status", "--meta", c.metaAddr)
	if code != 0 || !strings.Contains(out, "clients: 2") || !strings.Contains(out, m1) || !strings.Contains(out, m2) {
		t.Fatalf("weft status (exit %d) does not list both clients:\n%s%s", code, out, errOut)
	}
	code, out, errOut = runWeft(t, "status", "--meta", c.metaAddr, "--json")
	var js statusJSON
	if code != 0 || json.Unmarshal([]byte(out), &js) != nil || len(js.SessionList) != 2 {
		t.Fatalf("weft status --json (exit %d): %d sessions listed:\n%s%s", code, len(js.SessionList), out, errOut)
	}

	p2.must("open " + filepath.Join(m2, "victim"))
	p2.busy("lk wr 0 1")
	killed := time.Now()
	d1.Kill(t, syscall.SIGKILL)
	p2.send("lk wr 0 0 w")
	if got := p2.answer("F_SETLKW"); got != "ok" {
		t.Fatalf("F_SETLKW after the holder's mount died: %s", got)
	}
	t.Logf("lock of the killed mount granted to the waiter %v after the kill (lease %v)", time.Since(killed).Round(time.Millisecond), lease)
	p2.must("flock ex")
	c.waitFor("the dead client's session and unlinked file to go", failWait, func() bool {
		st, err := c.status()
		return err == nil && st.GetSessions() == 1 && st.GetGcPending() == 0 && dirBytes(c.data[0].dir) == 0
	})
	p1.cmd.Process.Kill()
	orphan.cmd.Process.Kill()
}

// cpuMs is the CPU time (user + system) a process has used, in ms.
func cpuMs(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) * 10 // clock ticks of 10 ms
}

// TestLockCost measures a lock + unlock round trip through a mount and
// the CPU it costs the meta server and the mount (logged, not asserted):
// go test ./internal/cli -run TestLockCost -v.
func TestLockCost(t *testing.T) {
	c := newFailCluster(t, 1, nil, nil)
	m1, d1 := lockMount(c)
	f, err := os.Create(filepath.Join(m1, "bench"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 500
	for _, kind := range []string{"fcntl", "flock"} {
		metaCPU, mountCPU := cpuMs(c.meta.Pid()), cpuMs(d1.Pid())
		start := time.Now()
		for range n {
			if kind == "flock" {
				err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
				if err == nil {
					err = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				}
			} else {
				lk := syscall.Flock_t{Type: syscall.F_WRLCK, Start: 0, Len: 1}
				err = syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk)
				if err == nil {
					lk.Type = syscall.F_UNLCK
					err = syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk)
				}
			}
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
		}
		el := time.Since(start)
		t.Logf("%s lock+unlock: %.2f ms per pair, CPU per pair: meta %.2f core-ms, mount %.2f core-ms (%d pairs)",
			kind, float64(el.Microseconds())/1000/n, (cpuMs(c.meta.Pid())-metaCPU)/n, (cpuMs(d1.Pid())-mountCPU)/n, n)
	}
}
