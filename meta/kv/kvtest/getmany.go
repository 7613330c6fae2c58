package kvtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/weft-fs/weft/meta/kv"
)

// getMany reads keys with kv.GetMany and returns them as show does.
func getMany(tx kv.Txn, keys ...string) ([]string, error) {
	bk := make([][]byte, len(keys))
	for i, k := range keys {
		bk[i] = []byte(k)
	}
	vals, found, err := kv.GetMany(tx, bk)
	if err != nil {
		return nil, err
	}
	if len(vals) != len(keys) || len(found) != len(keys) {
		return nil, fmt.Errorf("GetMany of %d keys returned %d values and %d flags", len(keys), len(vals), len(found))
	}
	out := make([]string, len(keys))
	for i := range keys {
		out[i] = show(vals[i], found[i])
	}
	return out, nil
}

// testGetMany reads many keys at once (more than one etcd Txn holds):
// present, absent, empty and repeated keys, in a View and, mixed with the
// transaction's own writes, in an Update; and from a View's snapshot after
// a later change.
func testGetMany(t *testing.T, e kv.Engine) {
	ctx := context.Background()
	const n = 250
	var kvs, keys, want []string
	for i := range n {
		k := fmt.Sprintf("m/%03d", i)
		kvs = append(kvs, k, fmt.Sprint("v", i))
		keys = append(keys, k, fmt.Sprintf("m/%03d-absent", i))
		want = append(want, fmt.Sprint("v", i), "<absent>")
	}
	kvs = append(kvs, "empty", "")
	for len(kvs) > 0 { // etcd: at most 128 writes per transaction
		m := min(len(kvs), 100)
		set(t, e, kvs[:m]...)
		kvs = kvs[m:]
	}
	keys = append(keys, "empty", "m/007", "m/007")
	want = append(want, "", "v7", "v7")
	err := e.View(ctx, func(tx kv.Txn) error {
		got, err := getMany(tx, keys...)
		if err != nil {
			return err
		}
		if !equal(got, want) {
			t.Errorf("View: GetMany of %d keys = %q, want %q", len(keys), got, want)
		}
		got, err = getMany(tx)
		if err != nil || len(got) != 0 {
			t.Errorf("View: GetMany of no keys = %q, %v", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	err = e.Update(ctx, func(tx kv.Txn) error {
		if _, _, err := tx.Get([]byte("m/003")); err != nil {
			return err
		}
		if err := tx.Set([]byte("m/001"), []byte("new")); err != nil {
			return err
		}
		if err := tx.Delete([]byte("m/002")); err != nil {
			return err
		}
		if err := tx.Set([]byte("m/added"), []byte("a")); err != nil {
			return err
		}
		got, err := getMany(tx, "m/001", "m/002", "m/003", "m/004", "m/added", "m/none")
		if err != nil {
			return err
		}
		if want := []string{"new", "<absent>", "v3", "v4", "a", "<absent>"}; !equal(got, want) {
			t.Errorf("Update: GetMany = %q, want %q", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	err = e.View(ctx, func(tx kv.Txn) error {
		if _, _, err := tx.Get([]byte("m/000")); err != nil {
			return err
		}
		set(t, e, "m/010", "changed", "m/011-absent", "created")
		got, err := getMany(tx, "m/010", "m/011-absent", "m/001")
		if err != nil {
			return err
		}
		if want := []string{"v10", "<absent>", "new"}; !equal(got, want) {
			t.Errorf("View after a later change: GetMany = %q, want the snapshot's %q", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
}
