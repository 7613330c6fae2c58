package meta

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"

	"github.com/weft-fs/weft/meta/kv"
)

// keyCallbackWriter is written (value: the meta server's id) by every
// namespace transaction of a meta server whose engine other meta servers
// share (kv.Watcher): the change feed knows its own transactions by it and
// skips them in the watch, having published them already with their
// origin. All servers write the same key; writes without a read of it
// never conflict.
var keyCallbackWriter = []byte("n/cbw")

// originKey is the context key of the session a request comes from.
type originKey struct{}

// withOrigin marks ctx as a request of session.
func withOrigin(ctx context.Context, session string) context.Context {
	return context.WithValue(ctx, originKey{}, session)
}

func originOf(ctx context.Context) string {
	s, _ := ctx.Value(originKey{}).(string)
	return s
}

// newServerID makes the id that marks this process's transactions.
func newServerID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recorder collects the keys one namespace transaction writes, to publish
// them as callbacks once it committed.
type recorder struct {
	kv.Txn
	keys   [][]byte
	marker []byte // value of keyCallbackWriter, nil if not written
}

// Set implements kv.Txn.
func (r *recorder) Set(key, value []byte) error {
	r.keys = append(r.keys, append([]byte(nil), key...))
	return r.Txn.Set(key, value)
}

// Delete implements kv.Txn.
func (r *recorder) Delete(key []byte) error {
	r.keys = append(r.keys, append([]byte(nil), key...))
	return r.Txn.Delete(key)
}

// GetMany implements kv.MultiGetter, reading together when the engine's
// transaction can.
func (r *recorder) GetMany(keys [][]byte) ([][]byte, []bool, error) {
	return kv.GetMany(r.Txn, keys)
}

// recordUpdate runs fn in the recording transaction; the engine may call
// it more than once (retries), and only the last run committed.
func (s *Service) recordUpdate(rec *recorder, t kv.Txn, fn func(kv.Txn) error) error {
	rec.Txn, rec.keys = t, rec.keys[:0]
	if err := fn(rec); err != nil {
		return err
	}
	if rec.marker != nil && len(rec.keys) > 0 {
		return t.Set(keyCallbackWriter, rec.marker)
	}
	return nil
}

// newRecorder returns the recorder of one namespace transaction.
func (s *Service) newRecorder() *recorder {
	rec := &recorder{}
	if _, ok := s.eng.(kv.Watcher); ok {
		rec.marker = []byte(s.cb.serverID)
	}
	return rec
}

// committed publishes what a committed transaction changed.
func (s *Service) committed(ctx context.Context, rec *recorder) {
	if len(rec.keys) > 0 {
		s.cb.publish(invalidationOf(rec.keys), originOf(ctx))
	}
}

// invalidationOf translates written keys into the inodes and entries
// clients may cache: n/i/<ino>, n/l/<ino>, n/x/<ino>/... -> the inode;
// n/d/<parent>/<name> -> the entry and its directory. Other keys (opens,
// sessions, GC queue, counters) are nothing a client caches.
func invalidationOf(keys [][]byte) invalidation {
	var inv invalidation
	seen := make(map[uint64]bool, len(keys))
	addIno := func(ino uint64) {
		if !seen[ino] {
			seen[ino] = true
			inv.inodes = append(inv.inodes, ino)
		}
	}
	for _, k := range keys {
		switch {
		case bytes.HasPrefix(k, prefixInode) && len(k) == len(prefixInode)+8:
			addIno(binary.BigEndian.Uint64(k[len(prefixInode):]))
		case bytes.HasPrefix(k, prefixSymlink) && len(k) == len(prefixSymlink)+8:
			addIno(binary.BigEndian.Uint64(k[len(prefixSymlink):]))
		case bytes.HasPrefix(k, prefixXattr) && len(k) > len(prefixXattr)+8:
			addIno(binary.BigEndian.Uint64(k[len(prefixXattr):]))
		case bytes.HasPrefix(k, prefixDentry) && len(k) > len(prefixDentry)+9 && k[len(prefixDentry)+8] == '/':
			parent := binary.BigEndian.Uint64(k[len(prefixDentry):])
			inv.entries = append(inv.entries, cbEntry{parent: parent, name: string(k[len(prefixDentry)+9:])})
			addIno(parent)
		}
	}
	return inv
}

// callbackLoop feeds the callbacks with the changes other meta servers
// make (engines that are a kv.Watcher) and forgets idle sessions, until
// ctx ends.
func (s *Service) callbackLoop(ctx context.Context) {
	if w, ok := s.eng.(kv.Watcher); ok {
		go func() {
			err := w.Watch(ctx, []byte("n/"), s.fromWatch)
			if ctx.Err() == nil {
				s.log.Error("the change feed of the metadata store stopped; clients fall back to short cache timeouts", "err", err)
				s.cb.publishAll()
			}
		}()
	}
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.cb.close()
			return
		case now := <-t.C:
			s.cb.collectIdle(now)
		}
	}
}

// fromWatch publishes one transaction seen in the store's watch, unless
// this server made it (published already, with its origin).
func (s *Service) fromWatch(ev kv.WatchEvent) {
	if ev.Lost {
		s.log.Warn("the change feed of the metadata store lost changes; telling every client to drop its metadata cache")
		s.cb.publishAll()
		return
	}
	keys := make([][]byte, 0, len(ev.Changes))
	for _, c := range ev.Changes {
		if bytes.Equal(c.Key, keyCallbackWriter) {
			if string(c.Value) == s.cb.serverID {
				return
			}
			continue
		}
		keys = append(keys, c.Key)
	}
	s.cb.publish(invalidationOf(keys), "")
}
