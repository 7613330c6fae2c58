// Package pebblekv is the embedded metadata engine: a pebble database in
// the meta server's directory. It needs no set-up and is the default.
//
// Transactions are serialized with group commit (group.go): Update queues
// its function for one committer goroutine, which runs the queued
// transactions one after the other on one indexed batch, so each sees the
// effects of all earlier ones (committed or earlier in its group) and
// conflicts cannot happen; a transaction whose function fails is dropped
// from the group without touching the others. The whole group then
// commits with one WAL sync, and only after that sync does any of its
// Updates return: every Update that returned nil is durable. Many
// concurrent writers thus share one fsync instead of waiting for one each.
// Views read a pebble snapshot and run concurrently with each other and
// with the committer.
package pebblekv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

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

	groups, txns uint64 // counted by the committer, for tests
}

// Open opens (creating if needed) the database in dir.
func Open(dir string) (*Engine, error) {
	return open(dir, nil)
}

// Tuning. Namespace operations are point reads, many of them of keys
// that do not exist (a lookup or create of a new name): bloom filters let
// those skip the tables, and a block cache keeps the index and data
// blocks of a namespace of millions of files in memory instead of
// decompressing them again on every read (pebble's default cache is 8 MiB).
const (
	cacheBytes    = 256 << 20
	memTableBytes = 64 << 20
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
	e := &Engine{db: db, wake: make(chan struct{}, 1), done: make(chan struct{})}
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

// txn is a transaction's view: r reads, w (the group's indexed batch) and
// rec (this transaction's own writes, to rebuild the group without it if
// a later one fails) take the writes; both nil in a view.
type txn struct {
	r   reader
	w   *pebble.Batch
	rec *pebble.Batch
}

func (t *txn) Get(key []byte) ([]byte, bool, error) {
	v, c, err := t.r.Get(key)
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
	opts := &pebble.IterOptions{}
	if len(start) > 0 {
		opts.LowerBound = start
	}
	if len(end) > 0 {
		opts.UpperBound = end
	}
	it, err := t.r.NewIter(opts)
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
	if t.w == nil {
		return kv.ErrReadOnly
	}
	if err := t.w.Set(key, value, nil); err != nil {
		return err
	}
	return t.rec.Set(key, value, nil)
}

func (t *txn) Delete(key []byte) error {
	if t.w == nil {
		return kv.ErrReadOnly
	}
	if err := t.w.Delete(key, nil); err != nil {
		return err
	}
	return t.rec.Delete(key, nil)
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
