package etcdkv_test

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/etcdkv"
)

// TestGuarded: a guarded engine commits while its guard holds; once it
// fails, Update returns ErrGuardFailed at once and writes nothing, while
// the unguarded engine goes on.
func TestGuarded(t *testing.T) {
	srv := etcdtest.Start(t)
	e := open(t, srv, "/guard/")
	ctx := context.Background()
	cli := e.Client()
	if _, err := cli.Put(ctx, e.Prefix()+"leader", "me"); err != nil {
		t.Fatal(err)
	}
	g := e.Guarded(clientv3.Compare(clientv3.Value(e.Prefix()+"leader"), "=", "me"))
	set := func(eng kv.Engine, k string) error {
		return eng.Update(ctx, func(t kv.Txn) error { return t.Set([]byte(k), []byte("v")) })
	}
	if err := set(g, "a"); err != nil {
		t.Fatalf("guarded update while the guard holds: %v", err)
	}
	if _, err := cli.Put(ctx, e.Prefix()+"leader", "other"); err != nil {
		t.Fatal(err)
	}
	if err := set(g, "b"); !errors.Is(err, etcdkv.ErrGuardFailed) {
		t.Fatalf("guarded update after the guard failed: %v, want ErrGuardFailed", err)
	}
	if err := set(e, "c"); err != nil {
		t.Fatalf("unguarded update: %v", err)
	}
	err := e.View(ctx, func(t kv.Txn) error {
		for k, want := range map[string]bool{"a": true, "b": false, "c": true} {
			if _, ok, err := t.Get([]byte(k)); err != nil || ok != want {
				return errors.Join(err, errors.New(k+": wrong presence"))
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := set(e, "d"); err != nil {
		t.Errorf("closing the guarded engine closed the client: %v", err)
	}
}
