package campaign

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one weft process of the campaign.
type proc struct {
	name string
	pid  int
	done chan struct{}
	err  string // how it exited, once done is closed

	mu       sync.Mutex
	expected bool // the campaign stopped it (else its exit is a finding)
}

// startProc runs weft with args (through the spawner) in its own process
// group; its output goes to logDir/NAME.log (appended).
func startProc(sp *spawner, weft, logDir, name string, env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "=== %s weft %s\n", time.Now().Format("15:04:05.000"), strings.Join(args, " "))
	logf.Close()
	pid, exit, err := sp.start(append([]string{weft}, args...), append(os.Environ(), env...), logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, pid: pid, done: make(chan struct{})}
	go func() {
		p.err = <-exit
		if p.err == "" {
			p.err = "exit status 0"
		}
		if logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
			fmt.Fprintf(logf, "=== %s exited: %s\n", time.Now().Format("15:04:05.000"), p.err)
			logf.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// unexpectedExit reports whether the process exited without the
// campaign stopping it.
func (p *proc) unexpectedExit() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.expected && !p.running()
}

// signal sends sig to the process group.
func (p *proc) signal(sig syscall.Signal) {
	if p.running() {
		syscall.Kill(-p.pid, sig)
	}
}

// stop sends sig (SIGKILL or SIGTERM) to the process group and waits for
// the exit: up to wait, then SIGKILL. It reports whether the process
// exited within wait.
func (p *proc) stop(sig syscall.Signal, wait time.Duration) bool {
	p.mu.Lock()
	p.expected = true
	p.mu.Unlock()
	if !p.running() {
		return true
	}
	p.signal(syscall.SIGCONT) // a paused process cannot act on SIGTERM
	p.signal(sig)
	select {
	case <-p.done:
		return true
	case <-time.After(wait):
	}
	p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	return false
}

// waitAddress waits for dir/address (written by weft meta and weft data
// once they listen) and returns it; it fails when p exits first.
func waitAddress(p *proc, dir string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "address"))
		if a := strings.TrimSpace(string(b)); err == nil && a != "" {
			return a, nil
		}
		if !p.running() {
			return "", fmt.Errorf("%s exited at start (%s); see its log", p.name, p.err)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s did not write its address in %v", p.name, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a free port on 127.0.0.1 as host:port, for a server
// started on it a moment later (and again on it after a restart). It is
// taken below the system's range of ephemeral ports, so that no
// outgoing connection takes it meanwhile.
func freePort() (string, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &lo)
	}
	const from = 10000
	for range 100 {
		if lo <= from+100 {
			break
		}
		port := from + rand.IntN(lo-from)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			ln.Close()
			return ln.Addr().String(), nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// logTail returns the last n lines of logDir/NAME.log.
func logTail(logDir, name string, n int) string {
	b, err := os.ReadFile(filepath.Join(logDir, name+".log"))
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	point, fsType, dev string
}

// mountsUnder lists the mounts on dir or below it, in mount order.
func mountsUnder(dir string) []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(fields) < sep+2 {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mountEntry{point: mp, fsType: fields[sep+1], dev: fields[2]})
		}
	}
	return out
}

// isMounted reports whether a FUSE file system is mounted on dir.
func isMounted(dir string) bool {
	for _, m := range mountsUnder(dir) {
		if m.point == dir && strings.HasPrefix(m.fsType, "fuse") {
			return true
		}
	}
	return false
}

// detach aborts the FUSE connections of the mounts on dir or below it
// (a FUSE server killed while a thread waits on its own mount never
// exits otherwise) and detaches them.
func detach(dir string) error {
	ms := mountsUnder(dir)
	var errs []error
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		if strings.HasPrefix(m.fsType, "fuse") {
			if _, minor, ok := strings.Cut(m.dev, ":"); ok {
				os.WriteFile("/sys/fs/fuse/connections/"+minor+"/abort", []byte("1"), 0o200)
			}
		}
		if err := syscall.Unmount(m.point, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", m.point, err))
		}
	}
	return errors.Join(errs...)
}
