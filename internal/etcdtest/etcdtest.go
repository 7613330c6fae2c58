// Package etcdtest starts a real etcd server process for tests: the etcd
// binary (Debian package etcd-server) on 127.0.0.1 with free ports and a
// data directory in the test's temporary directory.
package etcdtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is a running etcd server.
type Server struct {
	// Endpoints are the client endpoints (host:port).
	Endpoints []string
	cmd       *exec.Cmd
	exited    chan struct{} // closed when the process is reaped
	log       *lockedBuffer
}

// Start runs an etcd server for the test and stops it (and removes its
// data) in t.Cleanup. Without an etcd binary in PATH the test is skipped,
// or fails when the environment variable CI is "true".
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		msg := "etcd is not installed (apt-get install etcd-server); the etcd engine tests need it"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	var lastErr error
	for range 3 {
		s, err := start(bin, dir)
		if err == nil {
			t.Cleanup(s.stop)
			return s
		}
		lastErr = err
	}
	t.Fatalf("start etcd: %v", lastErr)
	return nil
}

// Launch runs an etcd server with its data under dir for a caller that is
// not a test (a long fault campaign); Stop ends it.
func Launch(dir string) (*Server, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("etcd is not installed (apt-get install etcd-server): %w", err)
	}
	var lastErr error
	for range 3 {
		s, err := start(bin, dir)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("start etcd: %w", lastErr)
}

// Stop terminates etcd (SIGTERM, then SIGKILL after 5s) and waits for it.
func (s *Server) Stop() { s.stop() }

func start(bin, dir string) (*Server, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	data, err := os.MkdirTemp(dir, "etcd-")
	if err != nil {
		return nil, err
	}
	log := new(lockedBuffer)
	cmd := exec.Command(bin,
		"--name", "weft-test",
		"--data-dir", data,
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "weft-test="+peer,
		"--initial-cluster-state", "new",
		"--log-level", "warn",
	)
	cmd.Stdout, cmd.Stderr = log, log
	// Own process group, and killed if the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %w", bin, err)
	}
	exited := make(chan struct{})
	s := &Server{Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", ports[0])}, cmd: cmd, exited: exited, log: log}
	go func() {
		cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return nil, fmt.Errorf("etcd exited at start-up:\n%s", log.String())
		default:
		}
		if healthy(client) {
			return s, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.kill()
	return nil, fmt.Errorf("etcd on %s not healthy after 20s:\n%s", client, log.String())
}

func healthy(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode == http.StatusOK && bytes.Contains(b.Bytes(), []byte(`"true"`))
}

func (s *Server) kill() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

// stop terminates etcd (SIGTERM, then SIGKILL after 5s) and waits for it.
func (s *Server) stop() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		s.kill()
	}
}

// Log returns what etcd printed so far.
func (s *Server) Log() string { return s.log.String() }

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
