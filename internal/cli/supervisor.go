package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopTimeout is how long a child may take to stop after SIGTERM before it
// gets SIGKILL.
const stopTimeout = 10 * time.Second

// child is one daemon (weft meta or weft data) that weft up runs as an OS
// process of its own and restarts when it dies.
type child struct {
	name    string // for messages: "meta service", "data server 2"
	dir     string // state directory holding the address file
	logPath string
	// fixedAddr keeps the listen address across restarts even when it is
	// taken (the meta service: clients and servers know it by address).
	fixedAddr bool
	// args returns the command line (after the program) for listening on
	// listen.
	args func(listen string) []string

	mu     sync.Mutex
	listen string // address to listen on at the next start
	addr   string // address the running instance listens on
	cmd    *exec.Cmd
	exited chan struct{} // closed when the current instance has exited
	err    error         // its exit status, once exited is closed
}

// supervisor starts and restarts children. Every child is forked from one
// OS thread that stays alive until Close: the children's parent-death
// signal (SIGTERM, so they stop if weft up is killed) is tied to the thread
// that forked them, not to the process.
type supervisor struct {
	exe          string
	restartDelay time.Duration
	stderr       io.Writer
	onRestart    func(c *child) // called after a restarted child listens

	spawn chan spawnReq
	quit  chan struct{}
	wg    sync.WaitGroup
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func newSupervisor(exe string, restartDelay time.Duration, stderr io.Writer) *supervisor {
	s := &supervisor{exe: exe, restartDelay: restartDelay, stderr: stderr, spawn: make(chan spawnReq), quit: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		for {
			select {
			case r := <-s.spawn:
				r.done <- r.cmd.Start()
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

// Close stops the forking thread; call it after every child has stopped.
func (s *supervisor) Close() {
	s.wg.Wait()
	close(s.quit)
}

// start launches one instance of c, appending its output to c.logPath. The
// instance stops with SIGTERM (then SIGKILL after stopTimeout) when ctx
// ends.
func (s *supervisor) start(ctx context.Context, c *child) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	os.Remove(c.dir + "/" + addressFileName)
	logf, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log file: %w", err)
	}
	args := c.args(c.listen)
	fmt.Fprintf(logf, "=== %s weft up starts %s: %s %s\n", time.Now().Format(time.RFC3339), c.name, s.exe, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, s.exe, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopTimeout
	req := spawnReq{cmd: cmd, done: make(chan error, 1)}
	select {
	case s.spawn <- req:
	case <-s.quit:
		logf.Close()
		return errors.New("the supervisor is closed")
	}
	if err := <-req.done; err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", s.exe, err)
	}
	exited := make(chan struct{})
	c.cmd, c.exited, c.err, c.addr = cmd, exited, nil, ""
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := cmd.Wait()
		logf.Close()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(exited)
	}()
	return nil
}

// waitListening waits until the running instance of c has written its
// address file, and makes that address the one to reuse on restart.
func (s *supervisor) waitListening(ctx context.Context, c *child, timeout time.Duration) (string, error) {
	c.mu.Lock()
	exited := c.exited
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr, err := waitAddressFile(ctx, c.dir, exited)
	if err != nil {
		return "", s.startFailure(c, err)
	}
	c.mu.Lock()
	c.addr, c.listen = addr, addr
	c.mu.Unlock()
	return addr, nil
}

// startFailure explains why c did not come up, quoting its log.
func (s *supervisor) startFailure(c *child, err error) error {
	c.mu.Lock()
	exited := c.exited
	c.mu.Unlock()
	select {
	case <-exited:
		c.mu.Lock()
		err = fmt.Errorf("it exited (%v)", c.err)
		c.mu.Unlock()
	default:
		if errors.Is(err, context.DeadlineExceeded) {
			err = errors.New("it did not start listening in time")
		}
	}
	if last := lastLogLine(c.logPath); last != "" {
		err = fmt.Errorf("%w: %s", err, last)
	}
	return failure("start the "+c.name, err, "see its log "+c.logPath)
}

// supervise restarts c whenever it exits, until ctx ends. Call it once c
// runs.
func (s *supervisor) supervise(ctx context.Context, c *child) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c.mu.Lock()
			exited := c.exited
			c.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-exited:
			}
			if ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			why := c.err
			c.mu.Unlock()
			if s.restartDelay == 0 {
				fmt.Fprintf(s.stderr, "weft: %s exited: %v; not restarting it (--restart-delay 0) (log: %s)\n", c.name, why, c.logPath)
				return
			}
			fmt.Fprintf(s.stderr, "weft: %s exited: %v; restarting in %v (log: %s)\n", c.name, why, s.restartDelay, c.logPath)
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.restartDelay):
			}
			if err := s.restart(ctx, c); err != nil {
				if ctx.Err() != nil {
					return
				}
				fmt.Fprintf(s.stderr, "weft: restart the %s: %v\n", c.name, err)
			}
		}
	}()
}

// restart starts c again on its last address (a new one if that is taken)
// and waits until it listens.
func (s *supervisor) restart(ctx context.Context, c *child) error {
	c.mu.Lock()
	if c.listen != "" && !c.fixedAddr && !addrFree(c.listen) {
		c.listen = anyPort(c.listen)
	}
	c.mu.Unlock()
	if err := s.start(ctx, c); err != nil {
		return err
	}
	addr, err := s.waitListening(ctx, c, time.Minute)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.stderr, "weft: %s is running again on %s\n", c.name, addr)
	if s.onRestart != nil {
		s.onRestart(c)
	}
	return nil
}

// wait blocks until the current instance of c has exited.
func (c *child) wait() {
	c.mu.Lock()
	exited := c.exited
	c.mu.Unlock()
	if exited != nil {
		<-exited
	}
}

// address is where the running instance of c listens.
func (c *child) address() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addr
}

// lastLogLine returns the last non-empty line of a log file, shortened.
func lastLogLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > 64<<10 {
		f.Seek(st.Size()-64<<10, io.SeekStart)
	}
	last := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "=== ") {
			last = l
		}
	}
	if len(last) > 300 {
		last = last[:300] + "..."
	}
	return last
}
