package pebblekv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/meta/kv"
)

func openTest(t *testing.T, fs disk.FS) *Engine {
	t.Helper()
	dir := t.TempDir()
	if fs != nil {
		dir = "/db"
	}
	e, err := OpenFS(dir, fs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// queued waits until n Updates wait in the queue.
func queued(t *testing.T, e *Engine, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		e.mu.Lock()
		got := len(e.queue)
		e.mu.Unlock()
		if got >= n {
			return
		}
	}
	t.Fatalf("%d Updates never got queued", n)
}

// blockCommitter starts an Update whose function blocks until the
// returned release is called, so that later Updates queue up and form one
// group.
func blockCommitter(t *testing.T, e *Engine) (release func()) {
	t.Helper()
	started, unblock := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- e.Update(context.Background(), func(tx kv.Txn) error {
			close(started)
			<-unblock
			return tx.Set([]byte("blocker"), []byte("1"))
		})
	}()
	<-started
	return func() {
		close(unblock)
		if err := <-errc; err != nil {
			t.Errorf("blocking update: %v", err)
		}
	}
}

// TestGroupCommit runs transactions that share one group: each sees the
// writes of the earlier ones, a failed one (after writing) is dropped
// without affecting the others, and a cancelled one is not applied.
func TestGroupCommit(t *testing.T) {
	e := openTest(t, nil)
	ctx := context.Background()
	release := blockCommitter(t, e)
	groups0 := e.groups

	errFail := errors.New("refused")
	type result struct {
		name string
		err  error
		seen map[string]bool
	}
	results := make(chan result, 5)
	get := func(tx kv.Txn, keys ...string) map[string]bool {
		seen := map[string]bool{}
		for _, k := range keys {
			_, ok, err := tx.Get([]byte(k))
			if err != nil {
				t.Error(err)
			}
			seen[k] = ok
		}
		return seen
	}
	cancelled, cancel := context.WithCancel(ctx)
	steps := []struct {
		name string
		ctx  context.Context
		fn   func(tx kv.Txn, r *result) error
	}{
		{"a", ctx, func(tx kv.Txn, r *result) error { return tx.Set([]byte("a"), []byte("1")) }},
		{"fails", ctx, func(tx kv.Txn, r *result) error {
			if err := tx.Set([]byte("b"), []byte("1")); err != nil {
				return err
			}
			if err := tx.Delete([]byte("a")); err != nil {
				return err
			}
			return errFail
		}},
		{"cancelled", cancelled, func(tx kv.Txn, r *result) error { return tx.Set([]byte("x"), []byte("1")) }},
		{"c", ctx, func(tx kv.Txn, r *result) error {
			r.seen = get(tx, "a", "b", "x")
			n := 0
			if err := tx.Scan(nil, nil, func(k, v []byte) (bool, error) { n++; return true, nil }); err != nil {
				return err
			}
			r.seen[fmt.Sprintf("scan=%d", n)] = true
			return tx.Set([]byte("c"), []byte("1"))
		}},
		{"read-only", ctx, func(tx kv.Txn, r *result) error { r.seen = get(tx, "c"); return nil }},
	}
	for i, s := range steps {
		go func() {
			r := result{name: s.name}
			r.err = e.Update(s.ctx, func(tx kv.Txn) error { return s.fn(tx, &r) })
			results <- r
		}()
		queued(t, e, i+1)
	}
	cancel()
	release()
	got := map[string]result{}
	for range steps {
		r := <-results
		got[r.name] = r
	}
	if e.groups != groups0+2 {
		t.Errorf("%d groups committed after the blocker, want 1", e.groups-groups0-1)
	}
	for name, want := range map[string]error{"a": nil, "fails": errFail, "cancelled": context.Canceled, "c": nil, "read-only": nil} {
		if err := got[name].err; !errors.Is(err, want) {
			t.Errorf("update %s: %v, want %v", name, err, want)
		}
	}
	// "c" sees "a" (earlier in the group, not yet committed) and the
	// blocker, nothing of the failed or cancelled ones.
	wantSeen := map[string]bool{"a": true, "b": false, "x": false, "scan=2": true}
	for k, v := range wantSeen {
		if got["c"].seen[k] != v {
			t.Errorf("update c saw %v, want %v", got["c"].seen, wantSeen)
			break
		}
	}
	if !got["read-only"].seen["c"] {
		t.Errorf("read-only update did not see c")
	}
	var keys []string
	if err := e.View(ctx, func(tx kv.Txn) error {
		return tx.Scan(nil, nil, func(k, v []byte) (bool, error) { keys = append(keys, string(k)); return true, nil })
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != "[a blocker c]" {
		t.Errorf("committed keys %v, want [a blocker c]", keys)
	}
}

// TestGroupCloseFailsQueued checks that Updates still queued when the
// engine closes fail with kv.ErrClosed and later ones too.
func TestGroupCloseFailsQueued(t *testing.T) {
	e := openTest(t, nil)
	release := blockCommitter(t, e)
	errc := make(chan error, 1)
	go func() {
		errc <- e.Update(context.Background(), func(tx kv.Txn) error { return tx.Set([]byte("late"), nil) })
	}()
	queued(t, e, 1)
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	for {
		e.mu.Lock()
		c := e.closed
		e.mu.Unlock()
		if c {
			break
		}
		time.Sleep(time.Millisecond)
	}
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, kv.ErrClosed) {
		t.Errorf("queued update: %v, want kv.ErrClosed", err)
	}
	if err := e.Update(context.Background(), func(kv.Txn) error { return nil }); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("update after close: %v, want kv.ErrClosed", err)
	}
}

// TestGroupDurability crashes the disk (losing everything not synced)
// while many writers commit, and checks that every Update that had
// returned nil before the crash is in the database reopened on the
// crashed disk, whole (each writes two keys).
func TestGroupDurability(t *testing.T) {
	for seed := int64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			fs := disk.NewMem(0)
			e := openTest(t, fs)
			rng := rand.New(rand.NewPCG(uint64(seed), 1))
			var mu sync.Mutex
			var acked []string
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := 0; w < 16; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						k := fmt.Sprintf("w%02d/%06d", w, i)
						err := e.Update(context.Background(), func(tx kv.Txn) error {
							if err := tx.Set([]byte(k+"/a"), []byte(k)); err != nil {
								return err
							}
							return tx.Set([]byte(k+"/b"), []byte(k))
						})
						if errors.Is(err, kv.ErrClosed) {
							return
						}
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						acked = append(acked, k)
						mu.Unlock()
					}
				}()
			}
			time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
			mu.Lock()
			mustHave := append([]string(nil), acked...)
			crashed := fs.CrashCopy(rng)
			mu.Unlock()
			close(stop)
			wg.Wait()
			e.Close()
			if len(mustHave) == 0 {
				t.Fatal("no update finished before the crash")
			}

			e2, err := OpenFS("/db", crashed)
			if err != nil {
				t.Fatal(err)
			}
			defer e2.Close()
			got := map[string]int{}
			if err := e2.View(context.Background(), func(tx kv.Txn) error {
				return tx.Scan(nil, nil, func(k, v []byte) (bool, error) { got[string(v)]++; return true, nil })
			}); err != nil {
				t.Fatal(err)
			}
			for _, k := range mustHave {
				if got[k] != 2 {
					t.Fatalf("update %s returned nil before the crash but %d of its 2 keys survived", k, got[k])
				}
			}
			for k, n := range got {
				if n != 2 {
					t.Errorf("update %s survived partly (%d of 2 keys)", k, n)
				}
			}
			t.Logf("%d updates acknowledged before the crash, %d survived, in %d groups", len(mustHave), len(got), e.groups)
		})
	}
}

// A lazy transaction (kv.Lazy) commits without a sync: a crash right
// after it loses it, and a synced transaction after it makes it durable
// too.
func TestLazyUpdates(t *testing.T) {
	tests := []struct {
		name      string
		thenSync  bool // a plain Update follows the lazy one
		wantLazy  bool // the lazy write survives the crash
		wantLazyN uint64
	}{
		{"lazy alone", false, false, 1},
		{"lazy, then synced", true, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := disk.NewMem(0)
			e := openTest(t, fs)
			ctx := context.Background()
			if err := e.Update(ctx, func(tx kv.Txn) error { return tx.Set([]byte("before"), []byte("1")) }); err != nil {
				t.Fatal(err)
			}
			if err := e.Update(kv.Lazy(ctx), func(tx kv.Txn) error { return tx.Set([]byte("lazy"), []byte("1")) }); err != nil {
				t.Fatal(err)
			}
			if err := e.View(ctx, func(tx kv.Txn) error {
				if _, ok, err := tx.Get([]byte("lazy")); err != nil || !ok {
					return fmt.Errorf("a lazy write is not visible once Update returned: %v %v", ok, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if tt.thenSync {
				if err := e.Update(ctx, func(tx kv.Txn) error { return tx.Set([]byte("after"), []byte("1")) }); err != nil {
					t.Fatal(err)
				}
			}
			if got := e.lazyGroups.Load(); got != tt.wantLazyN {
				t.Errorf("%d groups committed lazily, want %d", got, tt.wantLazyN)
			}
			crashed := fs.CrashCopy(nil) // nothing unsynced survives
			e.Close()
			e2, err := OpenFS("/db", crashed)
			if err != nil {
				t.Fatal(err)
			}
			defer e2.Close()
			if err := e2.View(ctx, func(tx kv.Txn) error {
				for k, want := range map[string]bool{"before": true, "lazy": tt.wantLazy, "after": tt.thenSync} {
					if _, ok, err := tx.Get([]byte(k)); err != nil || ok != want {
						t.Errorf("after the crash %q is there: %v, want %v (%v)", k, ok, want, err)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
