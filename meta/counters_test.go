package meta

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// statCounts returns the files and directories StatFS and Status report.
func statCounts(t *testing.T, s *Service) (files, dirs uint64) {
	t.Helper()
	st, err := s.Status(context.Background(), &weftv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := s.StatFS(context.Background(), &weftv1.StatFSRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if fs.Files != st.Files+st.Directories {
		t.Errorf("statfs counts %d inodes, status %d files + %d directories", fs.Files, st.Files, st.Directories)
	}
	return st.Files, st.Directories
}

// TestCountersAndInodeRanges creates and removes files, directories and
// symlinks concurrently and checks that the sharded counters are exact,
// that inode numbers are unique, that n/next stays above all of them, and
// that a restarted service reserves a new range instead of reusing one.
func TestCountersAndInodeRanges(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	const workers, each = 8, 150
	var mu sync.Mutex
	seen := map[uint64]string{}
	var wg sync.WaitGroup
	for w := range workers {
		d := e.mkdir(root, rootIno, fmt.Sprintf("w%d", w), 0o755)
		wg.Go(func() {
			for i := range each {
				name := fmt.Sprintf("n%d", i)
				var a *weftv1.Attr
				var err error
				switch i % 3 {
				case 0:
					var r *weftv1.CreateResponse
					r, err = e.s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: d.Ino, Name: name, Mode: 0o644, Exclusive: true})
					a = r.GetAttr()
				case 1:
					var r *weftv1.AttrResponse
					r, err = e.s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: d.Ino, Name: name, Mode: 0o755})
					a = r.GetAttr()
				default:
					var r *weftv1.AttrResponse
					r, err = e.s.Symlink(ctx, &weftv1.SymlinkRequest{Caller: root, Parent: d.Ino, Name: name, Target: "x"})
					a = r.GetAttr()
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if prev, dup := seen[a.Ino]; dup {
					t.Errorf("inode %d handed out twice (%s and %s)", a.Ino, prev, name)
				}
				seen[a.Ino] = fmt.Sprintf("w%d/%s", w, name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	files, dirs := statCounts(t, e.s)
	wantFiles, wantDirs := uint64(workers*each*2/3), uint64(1+workers+workers*each/3)
	if files != wantFiles || dirs != wantDirs {
		t.Errorf("counted %d files and %d directories, want %d and %d", files, dirs, wantFiles, wantDirs)
	}
	// Remove a third: files, then directories.
	for w := range workers {
		d, err := e.lookup(root, rootIno, fmt.Sprintf("w%d", w))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < each; i += 3 {
			if err := e.unlink(root, d.Ino, fmt.Sprintf("n%d", i)); err != nil {
				t.Fatal(err)
			}
			if err := e.rmdir(root, d.Ino, fmt.Sprintf("n%d", i+1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, dirs = statCounts(t, e.s)
	if files != wantFiles/2 || dirs != wantDirs-workers*each/3 {
		t.Errorf("after removals: %d files and %d directories, want %d and %d", files, dirs, wantFiles/2, wantDirs-workers*each/3)
	}
	var top uint64
	for ino := range seen {
		top = max(top, ino)
	}
	var next uint64
	if err := e.s.view(ctx, func(x *tx) error {
		var err error
		next, err = getUint64(x.t, keyNextIno)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if next <= top {
		t.Errorf("n/next = %d, not above the highest inode %d", next, top)
	}
	// A repair sets the count through the base key.
	if err := e.s.eng.Update(ctx, func(t kv.Txn) error { return setCount(t, false, 7) }); err != nil {
		t.Fatal(err)
	}
	if files, _ := statCounts(t, e.s); files != 7 {
		t.Errorf("after setCount(7): %d files", files)
	}

	e.reopen()
	a := e.create(root, rootIno, "after-restart", 0o644)
	if a.Ino < next {
		t.Errorf("after a restart inode %d was handed out, below n/next %d before it (reuse)", a.Ino, next)
	}
}

// TestCreateRateUniqueDirs measures creates per second through the meta
// service with 16 callers each in its own directory, on pebble and etcd.
// It only runs with WEFT_META_BENCH=1 and asserts nothing about speed.
func TestCreateRateUniqueDirs(t *testing.T) {
	if os.Getenv("WEFT_META_BENCH") != "1" {
		t.Skip("set WEFT_META_BENCH=1 to measure create rates")
	}
	srv := etcdtest.Start(t)
	data := startChunkServer(t)
	for n, engine := range []string{"pebble", "etcd"} {
		ctx := context.Background()
		var eng kv.Engine
		if engine == "etcd" {
			eng = openEtcd(t, srv, fmt.Sprintf("/rateu/%d/", n))
		}
		s := openService(t, eng, data)
		const callers = 16
		var done, conflicts atomic.Int64
		stop := time.Now().Add(3 * time.Second)
		start := time.Now()
		var wg sync.WaitGroup
		for w := range callers {
			d, err := s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: fmt.Sprint("d", w), Mode: 0o777})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				for i := 0; time.Now().Before(stop); i++ {
					_, err := s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: d.Attr.Ino, Name: fmt.Sprint("f", i), Mode: 0o644, Exclusive: true})
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
		t.Logf("%-6s %d callers in their own directories: %6.0f creates/s (%d gave up on conflicts)",
			engine, callers, float64(done.Load())/el.Seconds(), conflicts.Load())
		s.Close()
	}
}
