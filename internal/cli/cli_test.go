package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMainExitCodesAndMessages(t *testing.T) {
	tmp := t.TempDir()
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr []string
	}{
		{"help", nil, 0, "weft up", nil},
		{"version", []string{"version"}, 0, "weft devel", nil},
		{"unknown command", []string{"frobnicate"}, 2, "", []string{"weft: ", "Usage:"}},
		{"unknown flag", []string{"meta", "--bogus"}, 2, "", []string{"weft: unknown flag: --bogus", "Usage:", "--listen"}},
		{"meta without dir", []string{"meta"}, 2, "", []string{"--dir is required"}},
		{"meta bad chunk size", []string{"meta", "--dir", tmp, "--chunk-size", "3MiB"}, 2, "", []string{"power of two from 64KiB to 64MiB"}},
		{"meta chunk size not a size", []string{"meta", "--dir", tmp, "--chunk-size", "lots"}, 2, "", []string{"is not a size"}},
		{"meta stripe count 0", []string{"meta", "--dir", tmp, "--stripe-count", "0"}, 2, "", []string{"--stripe-count must be at least 1"}},
		{"meta timeouts", []string{"meta", "--dir", tmp, "--failure-timeout", "1s", "--heartbeat-interval", "2s"}, 2, "", []string{"--failure-timeout"}},
		{"data without meta", []string{"data", "--dir", tmp}, 2, "", []string{"--meta is required"}},
		{"mount without meta", []string{"mount", filepath.Join(tmp, "m")}, 2, "", []string{"--meta is required"}},
		{"mount without mountpoint", []string{"mount", "--meta", "127.0.0.1:1"}, 2, "", []string{"needs the MOUNTPOINT"}},
		{"up zero data servers", []string{"up", "--data-servers", "0"}, 2, "", []string{"--data-servers must be between 1 and 64"}},
		{"up bad chunk size", []string{"up", "--chunk-size", "100KiB"}, 2, "", []string{"power of two"}},
		{"up bad restart delay", []string{"up", "--restart-delay", "-1s"}, 2, "", []string{"--restart-delay must not be negative"}},
		{"up bad listen", []string{"up", "--listen", "nohostport"}, 2, "", []string{"--listen \"nohostport\" is not host:port"}},
		{"up replicas 0", []string{"up", "--replicas", "0"}, 2, "", []string{"--replicas must be between 1 and 8, got 0"}},
		{"up replicas 9", []string{"up", "--replicas", "9", "--data-servers", "10"}, 2, "", []string{"--replicas must be between 1 and 8, got 9"}},
		{"up replicas over servers", []string{"up", "--replicas", "3", "--data-servers", "2"}, 2, "",
			[]string{"--replicas 3 needs at least 3 data servers, but --data-servers is 2: raise --data-servers or lower --replicas"}},
		{"up short failure timeout", []string{"up", "--failure-timeout", "1s"}, 2, "", []string{"--failure-timeout must be longer than the 1s heartbeat interval"}},
		{"up bad repair delay", []string{"up", "--repair-delay", "0s"}, 2, "", []string{"--repair-delay must be positive"}},
		{"meta replicas 9", []string{"meta", "--dir", tmp, "--replicas", "9"}, 2, "", []string{"--replicas must be between 1 and 8, got 9"}},
		{"meta bad repair delay", []string{"meta", "--dir", tmp, "--repair-delay", "-1m"}, 2, "", []string{"--repair-delay must be positive"}},
		{"data sync bandwidth 0", []string{"data", "--dir", tmp, "--meta", "127.0.0.1:1", "--sync-bandwidth", "0"}, 2, "",
			[]string{"--sync-bandwidth must be a positive number of bytes per second"}},
		{"data bad scrub rate", []string{"data", "--dir", tmp, "--meta", "127.0.0.1:1", "--scrub-rate", "fast"}, 2, "", []string{"--scrub-rate: ", "is not a size"}},
		{"mount bad unavailable timeout", []string{"mount", "--meta", "127.0.0.1:1", "--unavailable-timeout", "0s", filepath.Join(tmp, "m")}, 2, "",
			[]string{"--unavailable-timeout must be positive"}},
		{"mount bad on-unavailable", []string{"mount", "--meta", "127.0.0.1:1", "--on-unavailable", "retry", filepath.Join(tmp, "m")}, 2, "",
			[]string{"--on-unavailable must be wait or fail, got \"retry\""}},
		{"up bad on-unavailable", []string{"up", "--on-unavailable", "hang"}, 2, "", []string{"--on-unavailable must be wait or fail, got \"hang\""}},
		{"target without subcommand", []string{"target"}, 2, "", []string{"weft target needs a subcommand: remove"}},
		{"target unknown subcommand", []string{"target", "add", "1"}, 2, "", []string{"unknown weft target subcommand \"add\""}},
		{"target remove without id", []string{"target", "remove", "--meta", "127.0.0.1:1"}, 2, "", []string{"needs the target ID"}},
		{"target remove bad id", []string{"target", "remove", "disk3", "--meta", "127.0.0.1:1"}, 2, "", []string{"target ID \"disk3\" is not a number"}},
		{"target remove without cluster", []string{"target", "remove", "3"}, 2, "", []string{"say which cluster: --meta ADDR"}},
		{"target remove unreachable", []string{"target", "remove", "3", "--meta", "127.0.0.1:1"}, 1, "", []string{"weft: cannot reach the meta service at 127.0.0.1:1"}},
		{"layout set replicas 0", []string{"layout", "set", tmp, "--replicas", "0"}, 2, "", []string{"--replicas must be at least 1"}},
		{"status without cluster", []string{"status"}, 2, "", []string{"--meta ADDR", "--dir DIR"}},
		{"status both", []string{"status", "--meta", "a:1", "--dir", tmp}, 2, "", []string{"either --meta or --dir"}},
		{"status unreachable", []string{"status", "--meta", "127.0.0.1:1"}, 1, "",
			[]string{"weft: cannot reach the meta service at 127.0.0.1:1: ", "; is weft meta running? start it with weft up or weft meta\n"}},
		{"status dir without cluster", []string{"status", "--dir", tmp}, 1, "", []string{"weft: find the meta service of " + tmp, "start the cluster with weft up"}},
		{"layout without subcommand", []string{"layout"}, 2, "", []string{"get or set"}},
		{"layout unknown subcommand", []string{"layout", "frob", "x"}, 2, "", []string{"unknown weft layout subcommand \"frob\""}},
		{"layout set nothing", []string{"layout", "set", tmp}, 2, "", []string{"say what to set"}},
		{"layout set stripe 0", []string{"layout", "set", tmp, "--stripe-count", "0"}, 2, "", []string{"--stripe-count must be at least 1"}},
		{"layout set bad size", []string{"layout", "set", tmp, "--chunk-size", "big"}, 2, "", []string{"is not a size"}},
		{"layout get not weft", []string{"layout", "get", tmp}, 1, "", []string{"weft: find the weft mount of " + tmp + ": it is not on a weft mount; "}},
		{"layout get missing", []string{"layout", "get", filepath.Join(tmp, "missing")}, 1, "", []string{"weft: stat ", "no such file or directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout %q does not contain %q", stdout.String(), tt.wantStdout)
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q does not contain %q", stderr.String(), w)
				}
			}
			if strings.Contains(stderr.String(), "goroutine ") || strings.Contains(stderr.String(), "panic") {
				t.Errorf("stderr has a stack trace: %s", stderr.String())
			}
			if tt.wantCode == 1 && strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
				t.Errorf("runtime error is not one line: %q", stderr.String())
			}
		})
	}
}

func TestParseMountInfoLine(t *testing.T) {
	tests := []struct {
		line string
		want mountInfo
		ok   bool
	}{
		{"36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
			mountInfo{Dev: "98:0", MountPoint: "/mnt/parent", FSType: "ext3", Source: "/dev/root"}, true},
		{"100 29 0:52 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:60 - fuse.weft weft rw,user_id=0,group_id=0,allow_other",
			mountInfo{Dev: "0:52", MountPoint: "/tmp/a b", FSType: "fuse.weft", Source: "weft"}, true},
		{"100 29 0:52 / /x rw - fuse weft rw", mountInfo{Dev: "0:52", MountPoint: "/x", FSType: "fuse", Source: "weft"}, true},
		{"garbage", mountInfo{}, false},
	}
	for _, tt := range tests {
		got, ok := parseMountInfoLine(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("parseMountInfoLine(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
	if !isWeftMount(mountInfo{FSType: "fuse.weft"}) || !isWeftMount(mountInfo{FSType: "fuse", Source: "weft"}) || isWeftMount(mountInfo{FSType: "ext4", Source: "weft"}) {
		t.Error("isWeftMount misclassifies")
	}
}

func TestWithin(t *testing.T) {
	tests := []struct {
		path, mp string
		want     bool
	}{
		{"/a/b", "/a", true}, {"/a", "/a", true}, {"/ab", "/a", false}, {"/x", "/", true},
	}
	for _, tt := range tests {
		if got := within(tt.path, tt.mp); got != tt.want {
			t.Errorf("within(%q, %q) = %v", tt.path, tt.mp, got)
		}
	}
}

func TestMountRecord(t *testing.T) {
	t.Setenv("WEFT_RUNTIME_DIR", t.TempDir())
	mp := "/some/mount point"
	if err := writeMountRecord(mp, "127.0.0.1:7000"); err != nil {
		t.Fatal(err)
	}
	rec, err := readMountRecord(mp)
	if err != nil || rec.MetaAddr != "127.0.0.1:7000" || rec.MountPoint != mp || rec.PID != os.Getpid() {
		t.Fatalf("readMountRecord = %+v, %v", rec, err)
	}
	removeMountRecord(mp)
	if _, err := readMountRecord(mp); !os.IsNotExist(err) {
		t.Fatalf("record still there after remove: %v", err)
	}
}

func TestAddressAndClusterFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := readAddressFile(dir); !os.IsNotExist(err) {
		t.Fatalf("readAddressFile of empty dir: %v", err)
	}
	if err := writeAddressFile(dir, "127.0.0.1:4242"); err != nil {
		t.Fatal(err)
	}
	if got, err := readAddressFile(dir); err != nil || got != "127.0.0.1:4242" {
		t.Fatalf("readAddressFile = %q, %v", got, err)
	}
	cf, exists, err := loadClusterFile(dir)
	if err != nil || exists {
		t.Fatalf("loadClusterFile of empty dir = %+v, %v, %v", cf, exists, err)
	}
	cf = clusterFile{MetaAddr: "127.0.0.1:1", DataAddrs: []string{"127.0.0.1:2", "127.0.0.1:3"}, MountPoint: "/m"}
	if err := cf.save(dir); err != nil {
		t.Fatal(err)
	}
	got, exists, err := loadClusterFile(dir)
	if err != nil || !exists || got.MetaAddr != cf.MetaAddr || len(got.DataAddrs) != 2 || got.DataAddrs[1] != "127.0.0.1:3" {
		t.Fatalf("loadClusterFile = %+v, %v, %v", got, exists, err)
	}
	os.WriteFile(filepath.Join(dir, clusterFileName), []byte("{"), 0o644)
	if _, _, err := loadClusterFile(dir); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("damaged cluster file: %v", err)
	}
}

func TestReuseAddr(t *testing.T) {
	held, err := listen("127.0.0.1:0", "--listen")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if got := reuseAddr(held.Addr().String(), "127.0.0.1:0"); got != "127.0.0.1:0" {
		t.Errorf("reuseAddr of a taken address = %q, want the fallback", got)
	}
	free := held.Addr().String()
	held.Close()
	if got := reuseAddr(free, "127.0.0.1:0"); got != free {
		t.Errorf("reuseAddr of a free address = %q, want %q", got, free)
	}
	if got := reuseAddr("", "127.0.0.1:0"); got != "127.0.0.1:0" {
		t.Errorf("reuseAddr of nothing = %q", got)
	}
	if got := anyPort("10.1.2.3:99"); got != "10.1.2.3:0" {
		t.Errorf("anyPort = %q", got)
	}
}

func TestListenErrors(t *testing.T) {
	held, err := listen("127.0.0.1:0", "--listen")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, err = listen(held.Addr().String(), "--listen")
	if err == nil || !strings.Contains(err.Error(), "already in use; stop the process using it or choose another address with --listen") {
		t.Fatalf("listen on a taken address: %v", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

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

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", timeout, what)
}

func TestSupervisorRestartsAChildThatDies(t *testing.T) {
	dir := t.TempDir()
	var stderr syncBuffer
	sup := newSupervisor("/bin/sh", 100*time.Millisecond, &stderr)
	restarted := make(chan struct{}, 10)
	sup.onRestart = func(c *child) { restarted <- struct{}{} }
	c := &child{
		name: "test server", dir: dir, logPath: filepath.Join(dir, "test.log"), listen: "127.0.0.1:0",
		args: func(listen string) []string {
			// The address file appears whole, as weft's daemons write it
			// (a reader must never see it empty).
			addr := filepath.Join(dir, "address")
			return []string{"-c", "echo listening on " + listen + "; echo " + listen + " > " + addr + ".tmp; mv " + addr + ".tmp " + addr + "; exec sleep 60"}
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sup.start(ctx, c); err != nil {
		t.Fatal(err)
	}
	addr, err := sup.waitListening(ctx, c, 10*time.Second)
	if err != nil || addr != "127.0.0.1:0" {
		t.Fatalf("waitListening = %q, %v", addr, err)
	}
	sup.supervise(ctx, c)
	first := c.cmd.Process.Pid
	syscall.Kill(first, syscall.SIGKILL)
	select {
	case <-restarted:
	case <-time.After(10 * time.Second):
		t.Fatalf("not restarted; stderr: %s", stderr.String())
	}
	if want := "weft: test server exited: signal: killed; restarting in 100ms (log: " + c.logPath + ")"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q does not contain %q", stderr.String(), want)
	}
	c.mu.Lock()
	second := c.cmd.Process.Pid
	c.mu.Unlock()
	if second == first {
		t.Fatal("same pid after restart")
	}
	cancel()
	c.wait()
	sup.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil || !strings.Contains(c.err.Error(), "terminated") {
		t.Errorf("stopped child's exit: %v, want terminated by SIGTERM", c.err)
	}
	logb, _ := os.ReadFile(c.logPath)
	if strings.Count(string(logb), "\nlistening on") != 2 {
		t.Errorf("log should have two starts: %s", logb)
	}
}

func TestSupervisorReportsStartFailureWithLog(t *testing.T) {
	dir := t.TempDir()
	sup := newSupervisor("/bin/sh", 0, &bytes.Buffer{})
	defer sup.Close()
	c := &child{
		name: "broken server", dir: dir, logPath: filepath.Join(dir, "b.log"),
		args: func(string) []string { return []string{"-c", "echo 'cannot open the store: disk on fire' >&2; exit 3"} },
	}
	if err := sup.start(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	_, err := sup.waitListening(context.Background(), c, 10*time.Second)
	want := "start the broken server: it exited (exit status 3): cannot open the store: disk on fire; see its log " + c.logPath
	if err == nil || err.Error() != want {
		t.Fatalf("waitListening error %q, want %q", err, want)
	}
}
