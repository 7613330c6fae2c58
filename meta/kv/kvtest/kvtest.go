// Package kvtest is the conformance suite every kv.Engine must pass: plain
// reads and writes, reads of many keys at once, range and prefix scans,
// read-your-writes and rollback inside transactions, snapshot isolation of
// View, and exact results under concurrent read-modify-write Updates.
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/weft-fs/weft/meta/kv"
)

// Run runs the suite. open must return a new, empty engine for each call
// and arrange (with t.Cleanup) for it to be closed; Close must be safe to
// call twice.
func Run(t *testing.T, open func(t *testing.T) kv.Engine) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e kv.Engine)
	}{
		{"GetSetDelete", testGetSetDelete},
		{"GetMany", testGetMany},
		{"ScanRange", testScanRange},
		{"ScanPrefix", testScanPrefix},
		{"ScanStopsEarly", testScanStopsEarly},
		{"ReadYourWrites", testReadYourWrites},
		{"Rollback", testRollback},
		{"ViewIsReadOnly", testViewIsReadOnly},
		{"ViewSnapshot", testViewSnapshot},
		{"ConcurrentCounter", testConcurrentCounter},
		{"CanceledContext", testCanceledContext},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, open(t))
		})
	}
}

func set(t *testing.T, e kv.Engine, kvs ...string) {
	t.Helper()
	err := e.Update(context.Background(), func(tx kv.Txn) error {
		for i := 0; i+1 < len(kvs); i += 2 {
			if err := tx.Set([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update set %q: %v", kvs, err)
	}
}

// get reads key in a View; "<absent>" if missing.
func get(t *testing.T, e kv.Engine, key string) string {
	t.Helper()
	var out string
	err := e.View(context.Background(), func(tx kv.Txn) error {
		v, ok, err := tx.Get([]byte(key))
		out = show(v, ok)
		return err
	})
	if err != nil {
		t.Fatalf("View get %q: %v", key, err)
	}
	return out
}

func show(v []byte, ok bool) string {
	if !ok {
		return "<absent>"
	}
	return string(v)
}

// scan returns the keys in [start, end) as "k=v" strings.
func scan(t *testing.T, tx kv.Txn, start, end []byte) []string {
	t.Helper()
	var out []string
	err := tx.Scan(start, end, func(k, v []byte) (bool, error) {
		out = append(out, string(k)+"="+string(v))
		return true, nil
	})
	if err != nil {
		t.Fatalf("Scan [%q, %q): %v", start, end, err)
	}
	return out
}

func viewScan(t *testing.T, e kv.Engine, start, end []byte) []string {
	t.Helper()
	var out []string
	if err := e.View(context.Background(), func(tx kv.Txn) error {
		out = scan(t, tx, start, end)
		return nil
	}); err != nil {
		t.Fatalf("View: %v", err)
	}
	return out
}

func equal(a, b []string) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func testGetSetDelete(t *testing.T, e kv.Engine) {
	if got := get(t, e, "a"); got != "<absent>" {
		t.Fatalf("empty engine: get a = %q", got)
	}
	set(t, e, "a", "1", "b", "2", "empty", "")
	set(t, e, "a", "3")
	bin := string([]byte{0, 0xff, 0})
	set(t, e, bin, "binary")
	if err := e.Update(context.Background(), func(tx kv.Txn) error {
		if err := tx.Delete([]byte("b")); err != nil {
			return err
		}
		return tx.Delete([]byte("never-set"))
	}); err != nil {
		t.Fatalf("Update delete: %v", err)
	}
	for _, c := range []struct{ key, want string }{
		{"a", "3"}, {"b", "<absent>"}, {"empty", ""}, {bin, "binary"}, {"never-set", "<absent>"},
	} {
		if got := get(t, e, c.key); got != c.want {
			t.Errorf("get %q = %q, want %q", c.key, got, c.want)
		}
	}
}

func testScanRange(t *testing.T, e kv.Engine) {
	set(t, e, "a", "1", "b", "2", "c", "3", "d", "4")
	for _, c := range []struct {
		name       string
		start, end string
		want       []string
	}{
		{"half-open", "b", "d", []string{"b=2", "c=3"}},
		{"no upper bound", "b", "", []string{"b=2", "c=3", "d=4"}},
		{"everything, empty start key", "", "", []string{"a=1", "b=2", "c=3", "d=4"}},
		{"bounds between keys", "a0", "c0", []string{"b=2", "c=3"}},
		{"empty range", "b", "b", nil},
		{"past the end", "e", "", nil},
	} {
		var end []byte
		if c.end != "" {
			end = []byte(c.end)
		}
		if got := viewScan(t, e, []byte(c.start), end); !equal(got, c.want) {
			t.Errorf("%s: scan [%q, %q) = %q, want %q", c.name, c.start, c.end, got, c.want)
		}
	}
}

func testScanPrefix(t *testing.T, e kv.Engine) {
	set(t, e, "p", "0", "p/1", "1", "p/2", "2", "p0", "x", "q", "y",
		"z\xff", "a", "z\xff\xff", "b", "z\xff\x00", "c")
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"p/", []string{"p/1=1", "p/2=2"}},
		{"p", []string{"p=0", "p/1=1", "p/2=2", "p0=x"}},
		{"z\xff", []string{"z\xff=a", "z\xff\x00=c", "z\xff\xff=b"}},
		{"nothing/", nil},
	} {
		p := []byte(c.prefix)
		if got := viewScan(t, e, p, kv.PrefixEnd(p)); !equal(got, c.want) {
			t.Errorf("scan prefix %q = %q, want %q", c.prefix, got, c.want)
		}
	}
	if end := kv.PrefixEnd([]byte{0xff, 0xff}); end != nil {
		t.Errorf("PrefixEnd(ff ff) = %x, want nil (no upper bound)", end)
	}
}

func testScanStopsEarly(t *testing.T, e kv.Engine) {
	set(t, e, "a", "1", "b", "2", "c", "3")
	var seen []string
	stop := errors.New("stop")
	err := e.View(context.Background(), func(tx kv.Txn) error {
		if err := tx.Scan([]byte("a"), nil, func(k, _ []byte) (bool, error) {
			seen = append(seen, string(k))
			return len(seen) < 2, nil
		}); err != nil {
			return err
		}
		return tx.Scan([]byte("a"), nil, func(k, _ []byte) (bool, error) { return true, stop })
	})
	if !errors.Is(err, stop) {
		t.Errorf("Scan whose callback fails returned %v, want the callback's error", err)
	}
	if !equal(seen, []string{"a", "b"}) {
		t.Errorf("Scan that returns more=false after 2 keys saw %q", seen)
	}
}

func testReadYourWrites(t *testing.T, e kv.Engine) {
	set(t, e, "k/1", "old", "k/2", "gone")
	err := e.Update(context.Background(), func(tx kv.Txn) error {
		for _, op := range []func() error{
			func() error { return tx.Set([]byte("k/1"), []byte("new")) },
			func() error { return tx.Set([]byte("k/3"), []byte("added")) },
			func() error { return tx.Delete([]byte("k/2")) },
		} {
			if err := op(); err != nil {
				return err
			}
		}
		for _, c := range []struct{ key, want string }{{"k/1", "new"}, {"k/2", "<absent>"}, {"k/3", "added"}} {
			v, ok, err := tx.Get([]byte(c.key))
			if err != nil {
				return err
			}
			if got := show(v, ok); got != c.want {
				t.Errorf("inside Update: get %q = %q, want %q", c.key, got, c.want)
			}
		}
		p := []byte("k/")
		if got, want := scan(t, tx, p, kv.PrefixEnd(p)), []string{"k/1=new", "k/3=added"}; !equal(got, want) {
			t.Errorf("inside Update: scan = %q, want %q", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got, want := viewScan(t, e, []byte("k/"), kv.PrefixEnd([]byte("k/"))), []string{"k/1=new", "k/3=added"}; !equal(got, want) {
		t.Errorf("after Update: scan = %q, want %q", got, want)
	}
}

func testRollback(t *testing.T, e kv.Engine) {
	set(t, e, "a", "1")
	fail := errors.New("fail")
	err := e.Update(context.Background(), func(tx kv.Txn) error {
		if err := tx.Set([]byte("a"), []byte("2")); err != nil {
			return err
		}
		if err := tx.Set([]byte("b"), []byte("2")); err != nil {
			return err
		}
		return fail
	})
	if !errors.Is(err, fail) {
		t.Fatalf("Update whose fn fails returned %v, want fn's error", err)
	}
	if a, b := get(t, e, "a"), get(t, e, "b"); a != "1" || b != "<absent>" {
		t.Errorf("after a failed Update: a=%q b=%q, want a=1 and b absent", a, b)
	}
}

func testViewIsReadOnly(t *testing.T, e kv.Engine) {
	err := e.View(context.Background(), func(tx kv.Txn) error {
		if err := tx.Set([]byte("a"), []byte("1")); !errors.Is(err, kv.ErrReadOnly) {
			t.Errorf("Set in View = %v, want kv.ErrReadOnly", err)
		}
		if err := tx.Delete([]byte("a")); !errors.Is(err, kv.ErrReadOnly) {
			t.Errorf("Delete in View = %v, want kv.ErrReadOnly", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	if got := get(t, e, "a"); got != "<absent>" {
		t.Errorf("after writes in a View: a = %q", got)
	}
}

// testViewSnapshot commits an Update while a View is open: the View keeps
// seeing the state of its start.
func testViewSnapshot(t *testing.T, e kv.Engine) {
	set(t, e, "a", "1", "b", "1")
	err := e.View(context.Background(), func(tx kv.Txn) error {
		if v, _, err := tx.Get([]byte("a")); err != nil || string(v) != "1" {
			return fmt.Errorf("first read in View: %q, %v", v, err)
		}
		done := make(chan error, 1)
		go func() {
			done <- e.Update(context.Background(), func(tx kv.Txn) error {
				if err := tx.Set([]byte("a"), []byte("2")); err != nil {
					return err
				}
				if err := tx.Set([]byte("c"), []byte("2")); err != nil {
					return err
				}
				return tx.Delete([]byte("b"))
			})
		}()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("concurrent Update: %w", err)
			}
		case <-time.After(30 * time.Second):
			return errors.New("an Update did not finish while a View was open: Views must not block writers")
		}
		if got := scan(t, tx, nil, nil); !equal(got, []string{"a=1", "b=1"}) {
			t.Errorf("View after a concurrent Update sees %q, want its snapshot [a=1 b=1]", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := viewScan(t, e, nil, nil); !equal(got, []string{"a=2", "c=2"}) {
		t.Errorf("a new View sees %q, want [a=2 c=2]", got)
	}
}

// testConcurrentCounter increments one counter from several goroutines
// with read-modify-write Updates; no increment may be lost. An Update that
// gives up with kv.ErrConflict applied nothing and is tried again.
func testConcurrentCounter(t *testing.T, e kv.Engine) {
	const workers, increments = 8, 25
	key := []byte("counter")
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range increments {
				for {
					err := e.Update(context.Background(), func(tx kv.Txn) error {
						v, _, err := tx.Get(key)
						if err != nil {
							return err
						}
						n := 0
						if len(v) > 0 {
							if n, err = strconv.Atoi(string(v)); err != nil {
								return err
							}
						}
						return tx.Set(key, []byte(strconv.Itoa(n+1)))
					})
					if errors.Is(err, kv.ErrConflict) {
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("increment: %v", err)
	}
	if got, want := get(t, e, string(key)), strconv.Itoa(workers*increments); got != want {
		t.Errorf("counter = %s after %d concurrent increments, want %s", got, workers*increments, want)
	}
}

func testCanceledContext(t *testing.T, e kv.Engine) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	err := e.Update(ctx, func(tx kv.Txn) error {
		called = true
		return tx.Set([]byte("a"), []byte("1"))
	})
	if err == nil && called {
		t.Errorf("Update with a canceled context committed")
	}
	if got := get(t, e, "a"); err != nil && got != "<absent>" {
		t.Errorf("Update failed with %v but a = %q", err, got)
	}
}

func testClosed(t *testing.T, e kv.Engine) {
	set(t, e, "a", "1")
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	noop := func(kv.Txn) error { return nil }
	if err := e.Update(context.Background(), noop); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Update after Close = %v, want kv.ErrClosed", err)
	}
	if err := e.View(context.Background(), noop); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("View after Close = %v, want kv.ErrClosed", err)
	}
}
