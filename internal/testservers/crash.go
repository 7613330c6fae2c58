package testservers

import (
	"bytes"
	"context"
	"path/filepath"

	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/meta/kv"
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
func (s *Servers) CrashMeta() int {
	s.t.Helper()
	if err := s.StopMeta(); err != nil {
		s.t.Fatalf("testservers: stop meta service: %v", err)
	}
	s.mu.Lock()
	dir, fs := s.metaCfg.Dir, s.metaCfg.FS
	s.mu.Unlock()
	eng, err := pebblekv.OpenFS(filepath.Join(dir, "db"), fs)
	if err != nil {
		s.t.Fatalf("testservers: open the meta service's store: %v", err)
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
		s.t.Fatalf("testservers: drop open records: %v", err)
	}
	s.StartMeta()
	return dropped
}

// PowerLoss stops every server and starts them all again on fs: what a
// power loss of the machine they share left of their file system (see
// disk.Mem.Crash and CrashCopy, taken by the caller at the instant of
// the loss). Whatever the servers did after that instant, and held in
// memory, is gone with the old file system.
func (s *Servers) PowerLoss(fs disk.FS) {
	s.t.Helper()
	s.StopMeta()
	for i := range s.data {
		s.StopData(i)
	}
	s.mu.Lock()
	s.opts.FS, s.metaCfg.FS = fs, fs
	s.mu.Unlock()
	s.StartMeta()
	for i := range s.data {
		s.StartData(i)
	}
}
