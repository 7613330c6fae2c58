// Package pebblekv is the embedded metadata engine: a pebble database in
// the meta server's directory. It needs no set-up and is the default.
//
// Transactions are serialized with group commit (group.go): Update queues
// its function for one committer goroutine, which runs the queued
// transactions one after the other, each seeing the effects of all
// earlier ones (committed, or earlier in its group: their writes are held
// in memory until the group commits), so conflicts cannot happen; a
// transaction whose function fails is dropped from the group without
// touching the others. The whole group then commits as one batch with one
// WAL sync, and only after that sync does any of its Updates return:
// every Update that returned nil is durable. Many concurrent writers thus
// share one fsync instead of waiting for one each; UpdateAll hands over
// several at once so that they share one for sure. The committer keeps
// the values it read in a cache (cache.go). Views read a pebble snapshot
// and run concurrently with each other and with the committer.
package pebblekv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/weft-fs/weft/meta/kv"
)

// Engine is a kv.Engine over a pebble database.
type Engine struct {
	db *pebble.DB

	mu     sync.Mutex // guards queue and closed
	queue  []*request // Updates waiting for the committer
	closed bool

	wake chan struct{} // nudges the committer (capacity 1)
	done chan struct{} // closed when the committer has exited

	cache *valueCache // committed states the committer knows (cache.go)

	groups, txns uint64        // counted by the committer, for tests
	dbGets       uint64        // reads of read-write transactions the cache could not answer (committer only)
	lazyGroups   atomic.Uint64 // groups committed without a sync (kv.Lazy)
}

// LazyCommits reports that transactions marked kv.Lazy commit unsynced.
func (e *Engine) LazyCommits() bool { return true }

// LazyGroups counts the commit groups written without a sync.
func (e *Engine) LazyGroups() uint64 { return e.lazyGroups.Load() }

// Open opens (creating if needed) the database in dir.
func Open(dir string) (*Engine, error) {
	return open(dir, nil)
}

// Tuning. Namespace operations are point reads, many of them of keys
// that do not exist (a lookup or create of a new name): bloom filters let
// those skip the tables, and a block cache keeps the index and data
// blocks of a namespace of millions of files in memory instead of
// decompressing them again on every read (pebble's default cache is 8 MiB).
// Memtables fill before they are flushed, and a point read seeks through
// every one not yet flushed (pebble grows them from 256 KiB and flushes
// once the immutable ones add up to a whole memtable): 8 MiB keeps that
// list short; 64 MiB made creates about 20% dearer.
const (
	cacheBytes    = 256 << 20
	memTableBytes = 8 << 20
	bloomBits     = 10
)

// open opens the database in dir on fs (nil: the operating system's).
func open(dir string, fs vfs.FS) (*Engine, error) {
	cache := pebble.NewCache(cacheBytes)
	defer cache.Unref() // the database holds its own reference
	opts := &pebble.Options{Logger: quietLogger{}, FS: fs, Cache: cache, MemTableSize: memTableBytes}
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(bloomBits)
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("open metadata database in %s: %w", dir, err)
	}
	e := &Engine{db: db, wake: make(chan struct{}, 1), done: make(chan struct{}), cache: newValueCache(cacheMaxBytes)}
	go e.commitLoop()
	return e, nil
}

// Name reports "pebble".
func (e *Engine) Name() string { return "pebble" }

// Update runs fn in a serialized read-write transaction. It returns once
// the transaction's group is committed and synced (or fn failed). fn runs
// on the engine's committer goroutine, so it must not call Update itself.
func (e *Engine) Update(ctx context.Context, fn func(kv.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &request{ctx: ctx, fn: fn, done: make(chan error, 1)}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return kv.ErrClosed
	}
	e.queue = append(e.queue, r)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	// Once queued the outcome is awaited even if ctx ends: the
	// transaction may already be part of a group being synced.
	return <-r.done
}

// UpdateAll queues every transaction at once, so that they commit in one
// group (with one sync) unless the group's limits split them, and waits
// for each outcome.
func (e *Engine) UpdateAll(ctxs []context.Context, fns []func(kv.Txn) error) []error {
	errs := make([]error, len(fns))
	reqs := make([]*request, 0, len(fns))
	for i, fn := range fns {
		if err := ctxs[i].Err(); err != nil {
			errs[i] = err
			continue
		}
		reqs = append(reqs, &request{ctx: ctxs[i], fn: fn, done: make(chan error, 1), idx: i})
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		for _, r := range reqs {
			errs[r.idx] = kv.ErrClosed
		}
		return errs
	}
	e.queue = append(e.queue, reqs...)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	for _, r := range reqs {
		errs[r.idx] = <-r.done
	}
	return errs
}

// View runs fn against a consistent snapshot.
func (e *Engine) View(ctx context.Context, fn func(kv.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return kv.ErrClosed
	}
	snap := e.db.NewSnapshot()
	e.mu.Unlock()
	defer snap.Close()
	return fn(&txn{r: snap})
}

// Close fails the Updates still queued with kv.ErrClosed, waits for the
// group being committed, and closes the database.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	<-e.done
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.db.Close()
}

type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

// txn is a transaction's view. A view (gw nil) reads the snapshot r. A
// read-write transaction runs on the committer: its writes and those of
// its group so far are held in gw until the group commits, and its reads
// look there first, then in the committer's cache (cache.go), then in the
// database, which holds the committed state (only the committer writes).
type txn struct {
	r  reader
	gw *groupWrites
	e  *Engine
}

func (t *txn) Get(key []byte) ([]byte, bool, error) {
	if t.gw == nil {
		return get(t.r, key)
	}
	if w, ok := t.gw.lookup(key); ok {
		if w.deleted {
			return nil, false, nil
		}
		return append([]byte(nil), w.v...), true, nil
	}
	if v, present, ok := t.e.cache.get(key); ok {
		if !present {
			return nil, false, nil
		}
		return append([]byte(nil), v...), true, nil
	}
	t.e.dbGets++
	v, ok, err := get(t.e.db, key)
	if err != nil {
		return nil, false, err
	}
	if ok {
		t.e.cache.put(string(key), v)
		v = append([]byte(nil), v...)
	} else {
		t.e.cache.putAbsent(string(key))
	}
	return v, ok, nil
}

// get reads key from r; the value returned is the caller's.
func get(r reader, key []byte) ([]byte, bool, error) {
	v, c, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get %q: %w", key, err)
	}
	out := append([]byte(nil), v...)
	c.Close()
	return out, true, nil
}

func (t *txn) Scan(start, end []byte, fn func(key, value []byte) (bool, error)) error {
	if t.gw == nil {
		return scan(t.r, start, end, fn)
	}
	pending := t.gw.inRange(start, end)
	if len(pending) == 0 {
		return scan(t.e.db, start, end, fn)
	}
	// The committed keys, with the group's writes laid over them.
	i := 0
	stopped := false
	emit := func(key, value []byte) (bool, error) {
		more, err := fn(key, value)
		stopped = err != nil || !more
		return more, err
	}
	// emitPending passes on the group's keys before upTo (nil: all).
	emitPending := func(upTo []byte) (bool, error) {
		for ; i < len(pending) && (upTo == nil || pending[i].key < string(upTo)); i++ {
			if pending[i].deleted {
				continue
			}
			if more, err := emit([]byte(pending[i].key), pending[i].v); err != nil || !more {
				return false, err
			}
		}
		return true, nil
	}
	err := scan(t.e.db, start, end, func(key, value []byte) (bool, error) {
		if more, err := emitPending(key); err != nil || !more {
			return false, err
		}
		if i < len(pending) && pending[i].key == string(key) {
			p := pending[i] // the group's state of this key wins
			i++
			if p.deleted {
				return true, nil
			}
			return emit(key, p.v)
		}
		return emit(key, value)
	})
	if err != nil || stopped {
		return err
	}
	_, err = emitPending(nil)
	return err
}

// scan iterates r over [start, end).
func scan(r reader, start, end []byte, fn func(key, value []byte) (bool, error)) error {
	opts := &pebble.IterOptions{}
	if len(start) > 0 {
		opts.LowerBound = start
	}
	if len(end) > 0 {
		opts.UpperBound = end
	}
	it, err := r.NewIter(opts)
	if err != nil {
		return fmt.Errorf("scan from %q: %w", start, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("scan at %q: %w", it.Key(), err)
		}
		more, err := fn(it.Key(), v)
		if err != nil {
			it.Close()
			return err
		}
		if !more {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("scan from %q: %w", start, err)
	}
	return nil
}

func (t *txn) Set(key, value []byte) error {
	if t.gw == nil {
		return kv.ErrReadOnly
	}
	t.gw.set(key, value)
	return nil
}

func (t *txn) Delete(key []byte) error {
	if t.gw == nil {
		return kv.ErrReadOnly
	}
	t.gw.del(key)
	return nil
}

// quietLogger keeps pebble's informational chatter out of the daemon log.
type quietLogger struct{}

func (quietLogger) Infof(string, ...interface{}) {}
func (quietLogger) Errorf(format string, args ...interface{}) {
	slog.Error(fmt.Sprintf("pebble: "+format, args...))
}
func (quietLogger) Fatalf(format string, args ...interface{}) {
	panic(fmt.Sprintf("pebble: "+format, args...))
}
