package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// upProcess is a "weft up" running as an OS process of the built binary.
type upProcess struct {
	dir, mnt string
	*testcluster.Proc
}

// startUp runs weft up on dir, mounting on mnt, and waits until it is
// mounted. Whatever is left of it (processes, mounts) is removed when the
// test ends.
func startUp(t *testing.T, dir, mnt string, args ...string) *upProcess {
	t.Helper()
	u := &upProcess{dir: dir, mnt: mnt}
	u.Proc = testcluster.StartProc(t, "weft up", testcluster.ProcOptions{Env: []string{"WEFT_RUNTIME_DIR=" + filepath.Join(dir, "..", "run")}},
		append([]string{"up", "--dir", dir, "--mount", mnt}, args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- output of weft up:\n%s", u.Output())
		}
		if u.Running() {
			syscall.Kill(-u.Pid(), syscall.SIGKILL)
			select {
			case <-u.Done():
			case <-time.After(10 * time.Second):
				// Stuck on its own mount: abort the FUSE connection.
				testcluster.CleanupUnder(filepath.Dir(dir))
				<-u.Done()
			}
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for !isMounted(mnt) || !strings.Contains(u.Output(), "weft is up") {
		select {
		case <-u.Done():
			t.Fatalf("weft up exited: %v\n%s", u.Err(), u.Output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("weft up did not mount %s in time\n%s", mnt, u.Output())
		}
	}
	return u
}

// stop runs fsck, which must find nothing, then sends SIGTERM and checks
// that weft up exits 0 and unmounted.
func (u *upProcess) stop(t *testing.T) {
	t.Helper()
	testcluster.CheckFsck(t, u.metaAddr(t))
	u.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-u.Done():
	case <-time.After(time.Minute):
		t.Fatalf("weft up did not stop within a minute of SIGTERM\n%s", u.Output())
	}
	if u.Err() != nil {
		t.Fatalf("weft up exited with %v after SIGTERM\n%s", u.Err(), u.Output())
	}
	if isMounted(u.mnt) {
		t.Fatalf("%s is still mounted after weft up stopped", u.mnt)
	}
	if pids := testcluster.PidsMentioning(u.dir); len(pids) > 0 {
		t.Fatalf("processes left running after weft up stopped: %v", pids)
	}
}

// metaAddr is the address of the cluster's meta service.
func (u *upProcess) metaAddr(t *testing.T) string {
	t.Helper()
	addr, err := readAddressFile(filepath.Join(u.dir, "meta"))
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// newUpDirs makes a cluster directory and mount point for a test, and
// removes every process and mount under them when it ends.
func newUpDirs(t *testing.T) (dir, mnt string) {
	t.Helper()
	testcluster.NeedFUSE(t)
	base := t.TempDir()
	t.Cleanup(func() {
		testcluster.CleanupUnder(base)
		if t.Failed() {
			logTails(t, filepath.Join(base, "cluster", "logs"))
		}
	})
	return filepath.Join(base, "cluster"), filepath.Join(base, "mnt")
}

// entryState is what must survive a restart of one name in the tree.
type entryState struct {
	mode   os.FileMode
	uid    uint32
	gid    uint32
	size   int64
	nlink  uint64
	mtime  int64
	target string
	xattr  string
	sha256 string
}

// snapshot records every entry below root.
func snapshot(t *testing.T, root string) map[string]entryState {
	t.Helper()
	out := map[string]entryState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e := entryState{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, size: st.Size, nlink: uint64(st.Nlink), mtime: st.Mtim.Nano()}
		if fi.Mode()&os.ModeSymlink != 0 {
			e.target, err = os.Readlink(p)
			if err != nil {
				return err
			}
		} else {
			buf := make([]byte, 256)
			if n, err := syscall.Getxattr(p, "user.color", buf); err == nil {
				e.xattr = string(buf[:n])
			}
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			e.sha256 = hex.EncodeToString(sum[:])
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

func TestUpPersistsFilesAcrossRestart(t *testing.T) {
	dir, mnt := newUpDirs(t)
	up := startUp(t, dir, mnt, "--data-servers", "3", "--chunk-size", "256KiB", "--stripe-count", "3")
	if !strings.Contains(up.Output(), "weft is up") {
		t.Errorf("weft up did not say it is up: %s", up.Output())
	}
	rng := rand.New(rand.NewSource(1))
	big := make([]byte, 6<<20+12345) // 25 chunks of 256 KiB over 3 chains
	rng.Read(big)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(mnt, "d"), 0o750))
	must(os.WriteFile(filepath.Join(mnt, "big"), big, 0o644))
	must(os.WriteFile(filepath.Join(mnt, "d", "small"), []byte("hello weft\n"), 0o600))
	must(os.Chmod(filepath.Join(mnt, "d", "small"), 0o640))
	must(os.Chown(filepath.Join(mnt, "d", "small"), 1234, 5678))
	must(syscall.Setxattr(filepath.Join(mnt, "d", "small"), "user.color", []byte("blue"), 0))
	must(os.Link(filepath.Join(mnt, "d", "small"), filepath.Join(mnt, "d", "hard")))
	must(os.Symlink("d/small", filepath.Join(mnt, "link")))
	f, err := os.Create(filepath.Join(mnt, "sparse"))
	must(err)
	_, err = f.WriteAt([]byte("end"), 5<<20)
	must(err)
	must(f.Close())
	old := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	must(os.Chtimes(filepath.Join(mnt, "big"), old, old))
	must(os.Chtimes(filepath.Join(mnt, "d", "small"), old, old))

	time.Sleep(1500 * time.Millisecond) // let the kernel's attribute cache expire
	before := snapshot(t, mnt)
	if before["big"].size != int64(len(big)) || before["d/small"].nlink != 2 || before["d/small"].uid != 1234 {
		t.Fatalf("unexpected state before restart: %+v", before)
	}
	up.stop(t)

	up = startUp(t, dir, mnt, "--data-servers", "3", "--chunk-size", "256KiB", "--stripe-count", "3")
	after := snapshot(t, mnt)
	for name, want := range before {
		got, ok := after[name]
		switch {
		case !ok:
			t.Errorf("%s is gone after the restart", name)
		case name == ".":
			// The root's mtime/nlink may legitimately differ (none here, but
			// atime-like updates are not part of the promise).
			if got.mode != want.mode || got.uid != want.uid {
				t.Errorf("root: got %+v, want %+v", got, want)
			}
		case got != want:
			t.Errorf("%s changed across the restart:\n got %+v\nwant %+v", name, got, want)
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("%s appeared after the restart", name)
		}
	}
	b, err := os.ReadFile(filepath.Join(mnt, "big"))
	if err != nil || !bytes.Equal(b, big) {
		t.Errorf("big file differs after restart (err %v)", err)
	}
	up.stop(t)
}

func TestUpRestartsKilledDataServer(t *testing.T) {
	dir, mnt := newUpDirs(t)
	up := startUp(t, dir, mnt, "--data-servers", "3", "--restart-delay", "500ms")
	data2 := filepath.Join(dir, "data2")
	pid := testcluster.PidOf("--dir", data2)
	if pid == 0 {
		t.Fatalf("no process of data server 2 found")
	}
	addrBefore, _ := readAddressFile(data2)
	syscall.Kill(pid, syscall.SIGKILL)
	want := fmt.Sprintf("data server 2 exited: signal: killed; restarting in 500ms (log: %s)", filepath.Join(dir, "logs", "data2.log"))
	waitFor(t, 30*time.Second, "the report of the killed data server", func() bool { return strings.Contains(up.Output(), want) })
	waitFor(t, 60*time.Second, "the restart of data server 2", func() bool {
		return strings.Contains(up.Output(), "data server 2 is running again")
	})
	if err := waitOnline(up.metaAddr(t), 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	if np := testcluster.PidOf("--dir", data2); np == 0 || np == pid {
		t.Fatalf("data server 2 pid after restart = %d (before %d)", np, pid)
	}
	if addrAfter, _ := readAddressFile(data2); addrAfter != addrBefore {
		t.Errorf("data server 2 moved from %s to %s; it should reuse its address", addrBefore, addrAfter)
	}
	content := bytes.Repeat([]byte("weft"), 1<<18) // 1 MiB
	p := filepath.Join(mnt, "after-restart")
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("read back after the restart: %v", err)
	}
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"status", "--dir", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("weft status: %d %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "servers: 3/3 online") {
		t.Errorf("status after restart:\n%s", stdout.String())
	}
	up.stop(t)
}

// metadataWorkload creates, renames, links and unlinks in root until stop
// is closed; errors are expected while the meta service is down.
func metadataWorkload(root string, stop <-chan struct{}, done chan<- int) {
	ops := 0
	for i := 0; ; i++ {
		select {
		case <-stop:
			done <- ops
			return
		default:
		}
		d := filepath.Join(root, fmt.Sprintf("d%d", i%7))
		os.Mkdir(d, 0o755)
		os.Mkdir(filepath.Join(d, fmt.Sprintf("sub%d", i%3)), 0o755)
		f := filepath.Join(root, fmt.Sprintf("f%d", i))
		os.WriteFile(f, []byte(f), 0o644)
		g := filepath.Join(d, fmt.Sprintf("g%d", i))
		os.Rename(f, g)
		os.Link(g, filepath.Join(root, fmt.Sprintf("h%d", i)))
		if i%3 == 0 {
			os.Remove(filepath.Join(root, fmt.Sprintf("h%d", i-3)))
		}
		if i%5 == 0 {
			os.Rename(filepath.Join(root, fmt.Sprintf("d%d", (i-5+70)%7), fmt.Sprintf("g%d", i-5)),
				filepath.Join(root, fmt.Sprintf("d%d", (i+1)%7), fmt.Sprintf("moved%d", i-5)))
		}
		if i%11 == 0 {
			os.Remove(filepath.Join(d, fmt.Sprintf("g%d", i)))
			os.Remove(filepath.Join(d, fmt.Sprintf("sub%d", (i+1)%3)))
		}
		if i%13 == 0 {
			os.Rename(filepath.Join(root, fmt.Sprintf("d%d", i%7), fmt.Sprintf("sub%d", i%3)),
				filepath.Join(root, fmt.Sprintf("d%d", (i+3)%7), fmt.Sprintf("sub-moved%d", i)))
		}
		ops++
	}
}

// checkNamespace walks root and checks that every entry is stat-able,
// every file's nlink equals the names found for it, and every directory's
// nlink is 2 + its subdirectories.
func checkNamespace(t *testing.T, root, metaAddr string) (files, dirs int) {
	t.Helper()
	explain := func(p string) string { return explainFromMeta(metaAddr, root, p) }
	names := map[uint64]int{}
	nlink := map[uint64]uint64{}
	where := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Errorf("walk %s: %v (%s)", p, err, explain(p))
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Errorf("listed entry %s cannot be stat'ed: %v (%s)", p, err, explain(p))
			return nil
		}
		if d.IsDir() {
			dirs++
			ents, err := os.ReadDir(p)
			if err != nil {
				t.Errorf("read dir %s: %v (%s)", p, err, explain(p))
				return nil
			}
			sub := 0
			for _, e := range ents {
				if e.IsDir() {
					sub++
				}
			}
			if uint64(st.Nlink) != uint64(2+sub) {
				t.Errorf("directory %s: nlink %d, want 2 + %d subdirectories", p, st.Nlink, sub)
			}
			return nil
		}
		files++
		names[st.Ino]++
		nlink[st.Ino] = uint64(st.Nlink)
		where[st.Ino] = p
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for ino, n := range names {
		if nlink[ino] != uint64(n) {
			t.Errorf("inode %d (%s): nlink %d but %d names found", ino, where[ino], nlink[ino], n)
		}
	}
	return files, dirs
}

func TestUpMetaKilledDuringMetadataWorkload(t *testing.T) {
	dir, mnt := newUpDirs(t)
	up := startUp(t, dir, mnt, "--data-servers", "2", "--restart-delay", "500ms")
	root := filepath.Join(mnt, "work")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan int, 1)
	go metadataWorkload(root, stop, done)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-done
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	metaDir := filepath.Join(dir, "meta")
	pid := testcluster.PidOf("meta", "--dir", metaDir)
	if pid == 0 {
		t.Fatal("no meta process found")
	}
	syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, 30*time.Second, "the report of the killed meta service", func() bool {
		return strings.Contains(up.Output(), "meta service exited: signal: killed; restarting in 500ms")
	})
	waitFor(t, 60*time.Second, "the restart of the meta service", func() bool {
		return strings.Contains(up.Output(), "meta service is running again")
	})
	time.Sleep(2 * time.Second) // the workload goes on against the restarted service
	close(stop)
	ops := <-done
	time.Sleep(1500 * time.Millisecond) // let the kernel's caches expire
	t.Log("checking the namespace through the mount that saw the meta service die")
	files, dirs := checkNamespace(t, mnt, up.metaAddr(t))
	t.Logf("%d workload iterations; namespace has %d files, %d directories", ops, files, dirs)
	if files == 0 {
		t.Error("the workload left no files")
	}
	// The namespace is also consistent as the meta service sees it through
	// a fresh mount after a full restart.
	up.stop(t)
	up = startUp(t, dir, mnt, "--data-servers", "2")
	t.Log("checking the namespace through a fresh mount after a full restart")
	checkNamespace(t, mnt, up.metaAddr(t))
	up.stop(t)
}

// logTails logs the end of every log file in dir, to explain a failure.
func logTails(t *testing.T, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		t.Logf("--- end of %s:\n%s", e.Name(), b)
	}
}

// explainFromMeta asks the meta service directly about path p (below the
// mount root), to tell a namespace fault from a client one.
func explainFromMeta(metaAddr, root, p string) string {
	cc, err := rpc.Dial(metaAddr)
	if err != nil {
		return err.Error()
	}
	defer cc.Close()
	mc := weftv1.NewMetaClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	caller := &weftv1.Caller{}
	ino := uint64(1)
	rel, _ := filepath.Rel(root, p)
	for _, name := range strings.Split(rel, "/") {
		if name == "." {
			continue
		}
		r, err := mc.Lookup(ctx, &weftv1.LookupRequest{Caller: caller, Parent: ino, Name: name})
		if err != nil {
			return fmt.Sprintf("meta: lookup %q in %d: %v", name, ino, err)
		}
		ino = r.GetAttr().GetIno()
	}
	a, err := mc.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: ino})
	if err != nil {
		return fmt.Sprintf("meta: getattr %d: %v", ino, err)
	}
	if _, err := mc.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: caller, Ino: ino, Plus: true}); err != nil && a.GetAttr().GetMode()&syscall.S_IFMT == syscall.S_IFDIR {
		return fmt.Sprintf("meta: inode %d (mode %o nlink %d): readdirplus: %v", ino, a.GetAttr().GetMode(), a.GetAttr().GetNlink(), err)
	}
	return fmt.Sprintf("meta: inode %d mode %o nlink %d looks fine", ino, a.GetAttr().GetMode(), a.GetAttr().GetNlink())
}
