package testcluster

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// weftBin is the weft binary built for this test process (see Main).
var weftBin struct {
	dir  string // set by Main: where to build it
	once sync.Once
	path string
	err  error
}

// Main runs the tests of a package that starts weft processes (mounts
// included) and removes the weft binary they ran afterwards; call it from
// TestMain: os.Exit(testcluster.Main(m)). The binary is built on first
// use (Binary), from the module's cmd/weft.
func Main(m interface{ Run() int }) int {
	dir, err := os.MkdirTemp("", "weft-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	weftBin.dir = dir
	return m.Run()
}

// Binary returns the weft binary of this test process, building it the
// first time; it fails the test if it cannot (or if the package's
// TestMain does not call Main).
func Binary(t testing.TB) string {
	t.Helper()
	weftBin.once.Do(func() {
		if weftBin.dir == "" {
			weftBin.err = fmt.Errorf("the package's TestMain must call testcluster.Main")
			return
		}
		p := filepath.Join(weftBin.dir, "weft")
		out, err := exec.Command("go", "build", "-o", p, "github.com/weft-fs/weft/cmd/weft").CombinedOutput()
		if err != nil {
			weftBin.err = fmt.Errorf("go build ./cmd/weft: %v\n%s", err, out)
			return
		}
		weftBin.path = p
	})
	if weftBin.err != nil {
		t.Fatalf("testcluster: the weft binary: %v", weftBin.err)
	}
	return weftBin.path
}

// NeedFUSE skips a test that mounts when this machine cannot.
func NeedFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("FUSE is not available (%v); install fuse3", err)
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			t.Skip("not root and no fusermount3; install fuse3")
		}
	}
}

// Proc is a weft process a test started (StartProc), in a process group
// of its own. It is killed when the test ends.
type Proc struct {
	// Name names the process in messages and its log.
	Name string
	// Cmd is the command; Cmd.Process is set.
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
	out  *syncBuffer // without a log file
}

// ProcOptions configures StartProc.
type ProcOptions struct {
	// Log is a file that stdout and stderr are appended to, after a line
	// naming the command; default: kept in memory (Proc.Output).
	Log string
	// Env is added to the test's environment (which gets WEFT_EXE, the
	// binary, for the commands that run daemons of their own).
	Env []string
}

// StartProc runs the weft binary with args.
func StartProc(t testing.TB, name string, o ProcOptions, args ...string) *Proc {
	t.Helper()
	p := startProc(t, name, o, args...)
	t.Cleanup(func() { p.Kill(t, syscall.SIGKILL) })
	return p
}

// startProc is StartProc without the cleanup.
func startProc(t testing.TB, name string, o ProcOptions, args ...string) *Proc {
	t.Helper()
	exe := Binary(t)
	p := &Proc{Name: name, Cmd: exec.Command(exe, args...), done: make(chan struct{})}
	var logf *os.File
	if o.Log != "" {
		var err error
		if logf, err = os.OpenFile(o.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			t.Fatalf("testcluster: log of %s: %v", name, err)
		}
		fmt.Fprintf(logf, "=== %s weft %s\n", time.Now().Format(time.TimeOnly), strings.Join(args, " "))
		p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	} else {
		p.out = &syncBuffer{}
		p.Cmd.Stdout, p.Cmd.Stderr = p.out, p.out
	}
	p.Cmd.Env = append(append(os.Environ(), "WEFT_EXE="+exe), o.Env...)
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.Cmd.Start(); err != nil {
		if logf != nil {
			logf.Close()
		}
		t.Fatalf("testcluster: start %s: %v", name, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		if logf != nil {
			logf.Close()
		}
		close(p.done)
	}()
	return p
}

// Pid is the process's id (and its group's).
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is what the process's Wait returned, once Done.
func (p *Proc) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Output is what the process printed so far (without ProcOptions.Log).
func (p *Proc) Output() string {
	if p.out == nil {
		return ""
	}
	return p.out.String()
}

// Kill sends sig to the process group and waits for the exit: after 15s
// it sends SIGKILL, after 10s more the test fails.
func (p *Proc) Kill(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if !p.Running() {
		return
	}
	syscall.Kill(-p.Pid(), sig)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		syscall.Kill(-p.Pid(), syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("testcluster: %s (pid %d) does not exit", p.Name, p.Pid())
		}
	}
}

// WaitFor polls cond every 50ms until it holds, and fails the test after
// timeout.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CleanupUnder kills every process whose command line mentions dir (the
// daemons a test started there) and detaches every mount below dir, so
// that no test leaves anything behind.
func CleanupUnder(dir string) {
	for _, pid := range PidsMentioning(dir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	mounts := Mounts()
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if m.Point != dir && !strings.HasPrefix(m.Point, dir+"/") {
			continue
		}
		// A FUSE server killed while a thread of its own waits on its
		// mount never exits until the connection is aborted.
		if strings.HasPrefix(m.FSType, "fuse") {
			if _, minor, ok := strings.Cut(m.Dev, ":"); ok {
				os.WriteFile("/sys/fs/fuse/connections/"+minor+"/abort", []byte("1"), 0o200)
			}
		}
		if err := syscall.Unmount(m.Point, syscall.MNT_DETACH); err != nil {
			exec.Command("fusermount3", "-u", "-z", m.Point).Run()
		}
	}
}

// PidsMentioning lists the processes (other than this one) with an
// argument equal to or below dir.
func PidsMentioning(dir string) []int {
	var pids []int
	eachProcess(func(pid int, args []string) {
		for _, a := range args {
			if a == dir || strings.HasPrefix(a, dir+"/") {
				pids = append(pids, pid)
				return
			}
		}
	})
	return pids
}

// PidOf finds the process with the given arguments in a row in its
// command line (e.g. "--dir", "/x/data2"); 0 if none.
func PidOf(args ...string) int {
	found := 0
	want := "\x00" + strings.Join(args, "\x00") + "\x00"
	eachProcess(func(pid int, cmdline []string) {
		if found == 0 && strings.Contains("\x00"+strings.Join(cmdline, "\x00")+"\x00", want) {
			found = pid
		}
	})
	return found
}

// eachProcess calls fn with every process but this one and its
// arguments.
func eachProcess(fn func(pid int, args []string)) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		fn(pid, strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"))
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

var _ io.Writer = (*syncBuffer)(nil)

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
