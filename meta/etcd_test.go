package meta

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/etcdkv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// openService opens a meta service over eng (nil: pebble in a temporary
// directory) and, when data is set, registers it as a data server of four
// targets.
func openService(t testing.TB, eng kv.Engine, data *chunkServer) *Service {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, Config{
		Dir:     t.TempDir(),
		Engine:  eng,
		Cluster: cluster.Config{Logger: quietLogger()},
		Logger:  quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if data == nil {
		return s
	}
	req := &weftv1.RegisterServerRequest{Uuid: "server-1", Address: data.addr, Hostname: "test"}
	for i := range 4 {
		req.Targets = append(req.Targets, &weftv1.TargetReport{
			Uuid: fmt.Sprintf("target-%d", i), Path: fmt.Sprintf("/t%d", i),
			TotalBytes: 1 << 40, FreeBytes: 1 << 39,
		})
	}
	if _, err := s.RegisterServer(ctx, req); err != nil {
		t.Fatal(err)
	}
	return s
}

func openEtcd(t testing.TB, srv *etcdtest.Server, prefix string) kv.Engine {
	t.Helper()
	eng, err := etcdkv.Open(context.Background(), etcdkv.Options{Endpoints: srv.Endpoints, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func readDirNames(t *testing.T, s *Service, dir uint64) []string {
	t.Helper()
	r, err := s.ReadDir(context.Background(), &weftv1.ReadDirRequest{Caller: root, Ino: dir, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range r.Entries {
		out = append(out, d.Name)
	}
	return out
}

// TestEtcdNamespace runs namespace operations on a meta service over etcd,
// then checks that a second meta service over the same etcd sees them.
func TestEtcdNamespace(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	s1 := openService(t, openEtcd(t, srv, "/ns/"), startChunkServer(t))
	d, err := s1.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "d", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	f, err := s1.Create(ctx, &weftv1.CreateRequest{Caller: alice, Parent: d.Attr.Ino, Name: "f", Mode: 0o644, Exclusive: true})
	if err == nil || errnoOf(t, err) != syscall.EACCES {
		t.Fatalf("create by alice in root's 0755 directory: %v, want EACCES", err)
	}
	if f, err = s1.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: d.Attr.Ino, Name: "f", Mode: 0o644, Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	if len(f.Attr.Layout.GetChains()) == 0 {
		t.Errorf("new file has no chains: %v", f.Attr.Layout)
	}
	steps := []struct {
		name string
		run  func() error
	}{
		{"link", func() error {
			_, err := s1.Link(ctx, &weftv1.LinkRequest{Caller: root, Ino: f.Attr.Ino, NewParent: rootIno, NewName: "hard"})
			return err
		}},
		{"mkdir sub", func() error {
			_, err := s1.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: d.Attr.Ino, Name: "sub", Mode: 0o755})
			return err
		}},
		{"rename f into sub", func() error {
			sub, err := s1.Lookup(ctx, &weftv1.LookupRequest{Caller: root, Parent: d.Attr.Ino, Name: "sub"})
			if err != nil {
				return err
			}
			_, err = s1.Rename(ctx, &weftv1.RenameRequest{Caller: root, OldParent: d.Attr.Ino, OldName: "f", NewParent: sub.Attr.Ino, NewName: "g"})
			return err
		}},
		{"symlink", func() error {
			_, err := s1.Symlink(ctx, &weftv1.SymlinkRequest{Caller: root, Parent: rootIno, Name: "ln", Target: "d/sub/g"})
			return err
		}},
		{"setxattr", func() error {
			_, err := s1.SetXattr(ctx, &weftv1.SetXattrRequest{Caller: root, Ino: f.Attr.Ino, Name: "user.k", Value: []byte("v")})
			return err
		}},
		{"unlink hard link", func() error {
			_, err := s1.Unlink(ctx, &weftv1.RemoveRequest{Caller: root, Parent: rootIno, Name: "hard"})
			return err
		}},
	}
	for _, st := range steps {
		if err := st.run(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
	}

	s2 := openService(t, openEtcd(t, srv, "/ns/"), nil)
	if s1.ClusterID() != s2.ClusterID() {
		t.Errorf("second meta service has cluster id %s, the first %s", s2.ClusterID(), s1.ClusterID())
	}
	if got := fmt.Sprint(readDirNames(t, s2, rootIno)); got != "[d ln]" {
		t.Errorf("second service lists / as %s, want [d ln]", got)
	}
	a, err := s2.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: f.Attr.Ino})
	if err != nil {
		t.Fatal(err)
	}
	if a.Attr.Nlink != 1 {
		t.Errorf("file nlink = %d after link + unlink, want 1", a.Attr.Nlink)
	}
	dd, err := s2.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: d.Attr.Ino})
	if err != nil {
		t.Fatal(err)
	}
	if dd.Attr.Nlink != 3 {
		t.Errorf("directory d nlink = %d with one subdirectory, want 3", dd.Attr.Nlink)
	}
	// The second service can create files: it knows the chains from etcd.
	if _, err := s2.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "from2", Mode: 0o644, Exclusive: true}); err != nil {
		t.Fatalf("create through the second service: %v", err)
	}
	if got := fmt.Sprint(readDirNames(t, s1, rootIno)); got != "[d from2 ln]" {
		t.Errorf("first service lists / as %s, want [d from2 ln]", got)
	}
}

// TestEtcdTwoServicesRace has 16 goroutines over two meta services sharing
// one etcd make the same directories and files: each name is made exactly
// once (the others get EEXIST), inode numbers are distinct and the link
// counts and listings are exact.
func TestEtcdTwoServicesRace(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	data := startChunkServer(t)
	s1 := openService(t, openEtcd(t, srv, "/race/"), data)
	s2 := openService(t, openEtcd(t, srv, "/race/"), nil)
	d, err := s1.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "files", Mode: 0o777})
	if err != nil {
		t.Fatal(err)
	}
	const workers, names = 16, 12
	var mu sync.Mutex
	made := map[string]int{}
	inos := map[uint64]string{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		s := []*Service{s1, s2}[w%2]
		wg.Go(func() {
			for i := range names {
				for _, op := range []struct {
					name string
					run  func() (*weftv1.Attr, error)
				}{
					{fmt.Sprintf("dir%02d", i), func() (*weftv1.Attr, error) {
						r, err := s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: fmt.Sprintf("dir%02d", i), Mode: 0o755})
						return r.GetAttr(), err
					}},
					{fmt.Sprintf("file%02d", i), func() (*weftv1.Attr, error) {
						r, err := s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: d.Attr.Ino, Name: fmt.Sprintf("file%02d", i), Mode: 0o644, Exclusive: true})
						return r.GetAttr(), err
					}},
				} {
					a, err := op.run()
					if errors.Is(err, syscall.EEXIST) {
						continue
					}
					if err != nil {
						errs <- fmt.Errorf("worker %d, %s: %w", w, op.name, err)
						return
					}
					mu.Lock()
					made[op.name]++
					if other, dup := inos[a.Ino]; dup {
						errs <- fmt.Errorf("inode %d given to both %s and %s", a.Ino, other, op.name)
					}
					inos[a.Ino] = op.name
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var wantRoot, wantFiles []string
	for i := range names {
		wantRoot = append(wantRoot, fmt.Sprintf("dir%02d", i))
		wantFiles = append(wantFiles, fmt.Sprintf("file%02d", i))
	}
	for _, n := range append(append([]string{}, wantRoot...), wantFiles...) {
		if made[n] != 1 {
			t.Errorf("%s made %d times, want exactly once", n, made[n])
		}
	}
	wantRoot = append(wantRoot, "files")
	sort.Strings(wantRoot)
	for _, s := range []*Service{s1, s2} {
		if got := readDirNames(t, s, rootIno); fmt.Sprint(got) != fmt.Sprint(wantRoot) {
			t.Errorf("/ lists %q, want %q", got, wantRoot)
		}
		if got := readDirNames(t, s, d.Attr.Ino); fmt.Sprint(got) != fmt.Sprint(wantFiles) {
			t.Errorf("/files lists %q, want %q", got, wantFiles)
		}
		r, err := s.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: rootIno})
		if err != nil {
			t.Fatal(err)
		}
		if want := uint32(2 + names + 1); r.Attr.Nlink != want {
			t.Errorf("root nlink = %d, want %d", r.Attr.Nlink, want)
		}
	}
}

// TestCreateRate measures creates per second through the meta service on
// the pebble and etcd engines with 1 and 16 concurrent callers, and on etcd
// also 16 callers spread over two meta services. It only runs with
// WEFT_META_BENCH=1 and asserts nothing about speed.
func TestCreateRate(t *testing.T) {
	if os.Getenv("WEFT_META_BENCH") != "1" {
		t.Skip("set WEFT_META_BENCH=1 to measure create rates")
	}
	srv := etcdtest.Start(t)
	data := startChunkServer(t)
	const dur = 3 * time.Second
	for n, c := range []struct {
		engine            string
		callers, services int
	}{
		{"pebble", 1, 1}, {"pebble", 16, 1}, {"etcd", 1, 1}, {"etcd", 16, 1}, {"etcd", 16, 2},
	} {
		ctx := context.Background()
		var services []*Service
		for i := range c.services {
			var eng kv.Engine
			if c.engine == "etcd" {
				eng = openEtcd(t, srv, fmt.Sprintf("/rate/%d/", n))
			}
			if i == 0 {
				services = append(services, openService(t, eng, data))
			} else {
				services = append(services, openService(t, eng, nil))
			}
		}
		d, err := services[0].Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "bench", Mode: 0o777})
		if err != nil {
			t.Fatal(err)
		}
		var done, conflicts atomic.Int64
		stop := time.Now().Add(dur)
		start := time.Now()
		var wg sync.WaitGroup
		for w := range c.callers {
			s := services[w%len(services)]
			wg.Go(func() {
				for i := 0; time.Now().Before(stop); i++ {
					_, err := s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: d.Attr.Ino, Name: fmt.Sprintf("f-%d-%d", w, i), Mode: 0o644, Exclusive: true})
					switch {
					case errors.Is(err, kv.ErrConflict):
						conflicts.Add(1)
					case err != nil:
						t.Error(err)
						return
					default:
						done.Add(1)
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		t.Logf("%-6s %2d callers, %d service(s): %6.0f creates/s (%d in %v, %d gave up on conflicts)",
			c.engine, c.callers, c.services, float64(done.Load())/el.Seconds(), done.Load(), el.Round(time.Millisecond), conflicts.Load())
		for _, s := range services {
			s.Close()
		}
	}
}

// TestEtcdTwoServicesRaceRename has 16 goroutines over two meta services
// move the same directories to different names: each moves exactly once
// (the others get ENOENT) and the link counts of both parents are exact.
func TestEtcdTwoServicesRaceRename(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s1 := openService(t, openEtcd(t, srv, "/rename/"), nil)
	s2 := openService(t, openEtcd(t, srv, "/rename/"), nil)
	mkdir := func(parent uint64, name string) uint64 {
		r, err := s1.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: parent, Name: name, Mode: 0o755})
		if err != nil {
			t.Fatal(err)
		}
		return r.Attr.Ino
	}
	src, dst := mkdir(rootIno, "src"), mkdir(rootIno, "dst")
	const workers, dirs = 16, 10
	for i := range dirs {
		mkdir(src, fmt.Sprintf("d%d", i))
	}
	var moved [dirs]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		s := []*Service{s1, s2}[w%2]
		wg.Go(func() {
			for i := range dirs {
				_, err := s.Rename(ctx, &weftv1.RenameRequest{Caller: root, OldParent: src, OldName: fmt.Sprintf("d%d", i), NewParent: dst, NewName: fmt.Sprintf("d%d-by-%d", i, w)})
				switch {
				case errors.Is(err, syscall.ENOENT):
				case err != nil:
					errs <- fmt.Errorf("worker %d, d%d: %w", w, i, err)
					return
				default:
					moved[i].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range dirs {
		if n := moved[i].Load(); n != 1 {
			t.Errorf("d%d moved %d times, want once", i, n)
		}
	}
	if got := readDirNames(t, s2, src); len(got) != 0 {
		t.Errorf("src still lists %q", got)
	}
	if got := readDirNames(t, s2, dst); len(got) != dirs {
		t.Errorf("dst lists %q, want %d entries", got, dirs)
	}
	for _, c := range []struct {
		ino  uint64
		want uint32
	}{{src, 2}, {dst, 2 + dirs}, {rootIno, 4}} {
		r, err := s2.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: c.ino})
		if err != nil {
			t.Fatal(err)
		}
		if r.Attr.Nlink != c.want {
			t.Errorf("inode %d nlink = %d, want %d", c.ino, r.Attr.Nlink, c.want)
		}
	}
}

// TestEtcdCloseSessionManyOpens closes a session with 200 open files over
// etcd with its default --max-txn-ops (128): one transaction could not drop
// them all.
func TestEtcdCloseSessionManyOpens(t *testing.T) {
	srv := etcdtest.Start(t)
	checkCloseManyOpens(t, openService(t, openEtcd(t, srv, "/close/"), startChunkServer(t)))
}

// TestEtcdManySessionsRestart opens 300 sessions, more than one etcd
// transaction may renew, and restarts the meta service: it starts, and
// every session is still there and renewable.
func TestEtcdManySessionsRestart(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	s := openService(t, openEtcd(t, srv, "/sessions/"), nil)
	const n = 300
	var ids []string
	for i := range n {
		r, err := s.OpenSession(ctx, &weftv1.OpenSessionRequest{Host: fmt.Sprintf("h%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Session)
	}
	s.Close()
	s = openService(t, openEtcd(t, srv, "/sessions/"), nil)
	if st := statusOf(t, s); st.Sessions != n {
		t.Fatalf("%d sessions after restart, want %d", st.Sessions, n)
	}
	for _, id := range ids {
		if _, err := s.RenewSession(ctx, &weftv1.RenewSessionRequest{Session: id}); err != nil {
			t.Fatalf("renew session %s after restart: %v", id, err)
		}
	}
}

// A meta server that has a directory's effective layout cached still
// gives new files the layout another meta server set meanwhile: its
// create's transaction sees the layout generation move.
func TestEtcdLayoutCacheAcrossServices(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := startChunkServer(t)
	s1 := openService(t, openEtcd(t, srv, "/lcache/"), data)
	s2 := openService(t, openEtcd(t, srv, "/lcache/"), nil)
	d, err := s1.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "d", Mode: 0o777})
	if err != nil {
		t.Fatal(err)
	}
	chunkSize := func(name string) uint32 {
		t.Helper()
		r, err := s1.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: d.Attr.Ino, Name: name, Mode: 0o644, Exclusive: true})
		if err != nil {
			t.Fatal(err)
		}
		return r.Attr.GetLayout().GetChunkSize()
	}
	before := chunkSize("a") // caches the directory's layout on s1
	chunkSize("b")           // from the cache
	const want = 4 << 20
	if before == want {
		t.Fatalf("the default chunk size is already %d", before)
	}
	if _, err := s2.SetLayout(ctx, &weftv1.SetLayoutRequest{Caller: root, Ino: d.Attr.Ino, Layout: &weftv1.Layout{ChunkSize: want}}); err != nil {
		t.Fatal(err)
	}
	if got := chunkSize("c"); got != want {
		t.Fatalf("after the other server set %d-byte chunks, a new file has %d (before: %d)", want, got, before)
	}
}
