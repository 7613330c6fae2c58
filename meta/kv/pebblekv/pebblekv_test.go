package pebblekv_test

import (
	"context"
	"testing"

	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/kvtest"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
)

func open(t *testing.T, dir string) *pebblekv.Engine {
	t.Helper()
	e, err := pebblekv.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) kv.Engine { return open(t, t.TempDir()) })
}

// TestReopenPersists checks that committed transactions survive closing
// and reopening the database, and a failed one left nothing behind.
func TestReopenPersists(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e := open(t, dir)
	want := map[string]string{"n/1": "root", "c/server/1": "s1", "empty": ""}
	if err := e.Update(ctx, func(tx kv.Txn) error {
		for k, v := range want {
			if err := tx.Set([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return tx.Set([]byte("deleted"), []byte("x"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.Update(ctx, func(tx kv.Txn) error { return tx.Delete([]byte("deleted")) }); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = open(t, dir)
	got := map[string]string{}
	if err := e.View(ctx, func(tx kv.Txn) error {
		return tx.Scan(nil, nil, func(k, v []byte) (bool, error) {
			got[string(k)] = string(v)
			return true, nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("after reopen: %q, want %q", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("after reopen: %q = %q (present %v), want %q", k, g, ok, v)
		}
	}
}
