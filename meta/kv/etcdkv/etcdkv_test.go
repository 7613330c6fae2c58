package etcdkv_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/etcdkv"
	"github.com/weft-fs/weft/meta/kv/kvtest"
)

var prefixes atomic.Int64

// open returns an engine over srv under a prefix no other engine of the
// test process uses, unless prefix is given.
func open(t *testing.T, srv *etcdtest.Server, prefix string) *etcdkv.Engine {
	t.Helper()
	if prefix == "" {
		prefix = fmt.Sprintf("/weft-test/%d/", prefixes.Add(1))
	}
	e, err := etcdkv.Open(context.Background(), etcdkv.Options{Endpoints: srv.Endpoints, Prefix: prefix, MaxAttempts: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func TestConformance(t *testing.T) {
	srv := etcdtest.Start(t)
	kvtest.Run(t, func(t *testing.T) kv.Engine { return open(t, srv, "") })
}

// TestPrefixIsolation checks that engines under different prefixes do not
// see each other's keys, also in unbounded scans.
func TestPrefixIsolation(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a, b := open(t, srv, "/a/"), open(t, srv, "/a0/")
	for _, e := range []*etcdkv.Engine{a, b} {
		if err := e.Update(ctx, func(tx kv.Txn) error { return tx.Set([]byte("k"), []byte(e.Name())) }); err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	if err := a.View(ctx, func(tx kv.Txn) error {
		return tx.Scan(nil, nil, func(k, _ []byte) (bool, error) {
			keys = append(keys, string(k))
			return true, nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "k" {
		t.Errorf("scan of everything under /a/ = %q, want [k]", keys)
	}
}

// TestConflictDetection runs an Update that reads or scans, lets another
// engine change what it read before it commits, and checks that the first
// attempt is rejected and the second sees the change.
func TestConflictDetection(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		read   func(tx kv.Txn) (string, error)
		change func(tx kv.Txn) error
	}{
		{"modify a read key", getK("d/b"), setK("d/b", "2")},
		{"create a key read as absent", getK("d/x"), setK("d/x", "new")},
		{"delete a read key", getK("d/b"), delK("d/b")},
		{"modify a key read by GetMany", getManyK("d/x", "d/b"), setK("d/b", "2")},
		{"create a key GetMany read as absent", getManyK("d/x", "d/b"), setK("d/x", "new")},
		{"insert into a scanned range", scanK("d/"), setK("d/c", "3")},
		{"delete from a scanned range", scanK("d/"), delK("d/a")},
		{"modify in a scanned range", scanK("d/"), setK("d/b", "9")},
		{"insert before where a scan stopped", scanFirst("d/"), setK("d/0", "0")},
	} {
		t.Run(c.name, func(t *testing.T) {
			prefix := fmt.Sprintf("/conflict/%d/", prefixes.Add(1))
			e1, e2 := open(t, srv, prefix), open(t, srv, prefix)
			if err := e1.Update(ctx, func(tx kv.Txn) error {
				tx.Set([]byte("d/a"), []byte("1"))
				return tx.Set([]byte("d/b"), []byte("1"))
			}); err != nil {
				t.Fatal(err)
			}
			var seen []string
			err := e1.Update(ctx, func(tx kv.Txn) error {
				got, err := c.read(tx)
				if err != nil {
					return err
				}
				seen = append(seen, got)
				if len(seen) == 1 {
					if err := e2.Update(ctx, c.change); err != nil {
						return fmt.Errorf("concurrent change: %w", err)
					}
				}
				return tx.Set([]byte("out"), []byte(got))
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(seen) != 2 || seen[0] == seen[1] {
				t.Errorf("attempts saw %q: want a rejected first attempt and a second one seeing the change", seen)
			}
		})
	}
}

func getK(k string) func(kv.Txn) (string, error) {
	return func(tx kv.Txn) (string, error) {
		v, ok, err := tx.Get([]byte(k))
		return fmt.Sprintf("%s %v", v, ok), err
	}
}

func getManyK(keys ...string) func(kv.Txn) (string, error) {
	return func(tx kv.Txn) (string, error) {
		bk := make([][]byte, len(keys))
		for i, k := range keys {
			bk[i] = []byte(k)
		}
		vals, found, err := kv.GetMany(tx, bk)
		return fmt.Sprintf("%q %v", vals, found), err
	}
}

func scanK(p string) func(kv.Txn) (string, error) {
	return func(tx kv.Txn) (string, error) {
		var out []string
		err := tx.Scan([]byte(p), kv.PrefixEnd([]byte(p)), func(k, v []byte) (bool, error) {
			out = append(out, string(k)+"="+string(v))
			return true, nil
		})
		return strings.Join(out, ","), err
	}
}

func scanFirst(p string) func(kv.Txn) (string, error) {
	return func(tx kv.Txn) (string, error) {
		var out string
		err := tx.Scan([]byte(p), nil, func(k, _ []byte) (bool, error) {
			out = string(k)
			return false, nil
		})
		return out, err
	}
}

func setK(k, v string) func(kv.Txn) error {
	return func(tx kv.Txn) error { return tx.Set([]byte(k), []byte(v)) }
}

func delK(k string) func(kv.Txn) error {
	return func(tx kv.Txn) error { return tx.Delete([]byte(k)) }
}

// TestNoConflictOutsideWhatWasRead checks that a change past where a scan
// stopped, or to keys never read, does not make a transaction retry.
func TestNoConflictOutsideWhatWasRead(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	e1, e2 := open(t, srv, "/noconflict/"), open(t, srv, "/noconflict/")
	if err := e1.Update(ctx, func(tx kv.Txn) error {
		tx.Set([]byte("d/a"), []byte("1"))
		return tx.Set([]byte("d/b"), []byte("1"))
	}); err != nil {
		t.Fatal(err)
	}
	attempts := 0
	err := e1.Update(ctx, func(tx kv.Txn) error {
		attempts++
		if _, err := scanFirst("d/")(tx); err != nil {
			return err
		}
		if attempts == 1 {
			if err := e2.Update(ctx, setK("d/c", "1")); err != nil {
				return err
			}
			if err := e2.Update(ctx, setK("other", "1")); err != nil {
				return err
			}
		}
		return tx.Set([]byte("out"), []byte("1"))
	})
	if err != nil || attempts != 1 {
		t.Errorf("Update = %v after %d attempts, want success at the first", err, attempts)
	}
}

// TestTwoEnginesRace has 16 goroutines over two engines (as two meta
// servers would) create names in one directory if absent, checking by a
// scan of the directory or by a Get, and counting creations in a shared
// counter: every name is created exactly once and the counter is exact.
func TestTwoEnginesRace(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	engines := []*etcdkv.Engine{open(t, srv, "/race/"), open(t, srv, "/race/")}
	const workers, names = 16, 20
	var mu sync.Mutex
	winners := map[string][]int{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		e := engines[w%2]
		wg.Go(func() {
			for i := range names {
				name := fmt.Sprintf("dir/%03d", i)
				byScan := (w+i)%2 == 0
				created := false
				err := e.Update(ctx, func(tx kv.Txn) error {
					created = false
					exists := false
					if byScan {
						p := []byte("dir/")
						if err := tx.Scan(p, kv.PrefixEnd(p), func(k, _ []byte) (bool, error) {
							exists = string(k) == name
							return !exists, nil
						}); err != nil {
							return err
						}
					} else {
						_, ok, err := tx.Get([]byte(name))
						if err != nil {
							return err
						}
						exists = ok
					}
					if exists {
						return nil
					}
					v, _, err := tx.Get([]byte("count"))
					if err != nil {
						return err
					}
					n, _ := strconv.Atoi(string(v))
					if err := tx.Set([]byte("count"), []byte(strconv.Itoa(n+1))); err != nil {
						return err
					}
					created = true
					return tx.Set([]byte(name), []byte(strconv.Itoa(w)))
				})
				if err != nil {
					errs <- fmt.Errorf("worker %d, %s: %w", w, name, err)
					return
				}
				if created {
					mu.Lock()
					winners[name] = append(winners[name], w)
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
	for i := range names {
		name := fmt.Sprintf("dir/%03d", i)
		if len(winners[name]) != 1 {
			t.Errorf("%s created by workers %v, want exactly one", name, winners[name])
		}
	}
	err := engines[1].View(ctx, func(tx kv.Txn) error {
		v, _, err := tx.Get([]byte("count"))
		if err != nil {
			return err
		}
		if string(v) != strconv.Itoa(names) {
			t.Errorf("count = %s, want %d", v, names)
		}
		n := 0
		p := []byte("dir/")
		err = tx.Scan(p, kv.PrefixEnd(p), func(k, v []byte) (bool, error) {
			n++
			if w, _ := strconv.Atoi(string(v)); len(winners[string(k)]) == 1 && winners[string(k)][0] != w {
				t.Errorf("%s holds worker %d, but worker %v reported creating it", k, w, winners[string(k)])
			}
			return true, nil
		})
		if n != names {
			t.Errorf("%d names in the directory, want %d", n, names)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLargeTransaction checks a transaction of more writes than etcd's
// default limit fails with an error that says what to do, and that one
// within the limit works.
func TestLargeTransaction(t *testing.T) {
	srv := etcdtest.Start(t)
	e := open(t, srv, "")
	ctx := context.Background()
	write := func(n int) error {
		return e.Update(ctx, func(tx kv.Txn) error {
			for i := range n {
				if err := tx.Set([]byte(fmt.Sprintf("k/%04d", i)), []byte("v")); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := write(100); err != nil {
		t.Fatalf("100 writes in one transaction: %v", err)
	}
	err := write(300)
	if err == nil || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("300 writes in one transaction: %v, want an error naming --max-txn-ops", err)
	}
}

// TestDownCluster checks that an unreachable etcd gives an error naming
// the endpoint and what to do.
func TestDownCluster(t *testing.T) {
	ctx := context.Background()
	_, err := etcdkv.Open(ctx, etcdkv.Options{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: 500 * time.Millisecond})
	if err == nil {
		t.Fatal("Open of an unreachable etcd succeeded")
	}
	for _, want := range []string{"127.0.0.1:1", "start the etcd cluster"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := etcdkv.Open(ctx, etcdkv.Options{}); err == nil {
		t.Error("Open without endpoints succeeded")
	}
}

// TestClosedDuringUse checks that calls after Close report kv.ErrClosed,
// also from inside a transaction that was running.
func TestClosedDuringUse(t *testing.T) {
	srv := etcdtest.Start(t)
	e := open(t, srv, "")
	err := e.Update(context.Background(), func(tx kv.Txn) error {
		e.Close()
		_, _, err := tx.Get([]byte("a"))
		return err
	})
	if !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Get after Close inside Update = %v, want kv.ErrClosed", err)
	}
}
