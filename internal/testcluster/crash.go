package testcluster

import (
	"bytes"
	"context"
	"path/filepath"

	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/etcdkv"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
)

// Keys of the meta service's store that a crash can lose (meta/keys.go):
// the record of a clean stop and the open records, which the meta service
// commits without a sync (meta/replay.go).
var (
	keyCleanStop   = []byte("n/stop")
	prefixOpen     = []byte("n/o/")
	prefixSessOpen = []byte("n/so/")
)

// CrashMeta stops the meta service and leaves its store as a crash of
// the machine may: the stop was not clean, and every open record is lost
// (the worst a crash can do to opens, which are committed lazily). Then
// it starts the meta service again. It returns how many open records
// were dropped.
func (c *Cluster) CrashMeta() int {
	c.t.Helper()
	if err := c.StopMeta(); err != nil {
		c.t.Fatalf("testcluster: stop meta service: %v", err)
	}
	c.mu.Lock()
	dir, fs := c.metaCfg.Dir, c.metaCfg.FS
	c.mu.Unlock()
	var eng kv.Engine
	var err error
	if c.etcd != nil {
		eng, err = etcdkv.Open(context.Background(), etcdkv.Options{Endpoints: c.etcd.Endpoints})
	} else {
		eng, err = pebblekv.OpenFS(filepath.Join(dir, "db"), fs)
	}
	if err != nil {
		c.t.Fatalf("testcluster: open the meta service's store: %v", err)
	}
	dropped := 0
	err = eng.Update(context.Background(), func(t kv.Txn) error {
		dropped = 0
		var keys [][]byte
		for _, p := range [][]byte{prefixOpen, prefixSessOpen} {
			err := t.Scan(p, kv.PrefixEnd(p), func(k, _ []byte) (bool, error) {
				keys = append(keys, bytes.Clone(k))
				return true, nil
			})
			if err != nil {
				return err
			}
		}
		for _, k := range append(keys, keyCleanStop) {
			if err := t.Delete(k); err != nil {
				return err
			}
		}
		dropped = len(keys) / 2
		return nil
	})
	if cerr := eng.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		c.t.Fatalf("testcluster: drop open records: %v", err)
	}
	c.StartMeta()
	return dropped
}

// PowerLoss simulates a power loss of the machine the cluster runs on:
// the mounts go away (unmounted first, as the workload is over), every
// server stops, and all start again on fs, what the loss left of their
// file system (disk.Mem.CrashCopy, taken by the caller at the instant of
// the loss); then the file system is mounted again. Whatever the
// servers did after that instant, and held in memory, is gone with the
// old file system. It returns once every data server is back online
// (and, with replicas, every chain healthy).
func (c *Cluster) PowerLoss(fs disk.FS) {
	c.t.Helper()
	remount := c.stopMounts()
	c.StopMeta()
	for i := range c.data {
		c.StopData(i)
	}
	c.mu.Lock()
	c.opts.FS, c.metaCfg.FS = fs, fs
	c.mu.Unlock()
	c.StartMeta()
	for i := range c.data {
		c.StartData(i)
	}
	c.WaitOnline(len(c.data))
	if c.replicated() {
		c.WaitHealthy()
	}
	for _, args := range remount {
		c.Mount(args...)
	}
}
