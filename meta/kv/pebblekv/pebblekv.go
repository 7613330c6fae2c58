// Package pebblekv is the embedded metadata engine: a pebble database in
// the meta server's directory. It needs no set-up and is the default.
//
// Transactions are serialized: Update holds one writer lock while fn runs
// and its batch commits with a WAL sync, so every transaction sees the
// effects of all earlier ones and conflicts cannot happen. Views read a
// pebble snapshot and run concurrently with each other and with Update.
package pebblekv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/weft-fs/weft/meta/kv"
)

// Engine is a kv.Engine over a pebble database.
type Engine struct {
	db     *pebble.DB
	mu     sync.Mutex // serializes Update
	closed bool
}

// Open opens (creating if needed) the database in dir.
func Open(dir string) (*Engine, error) {
	opts := &pebble.Options{Logger: quietLogger{}}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("open metadata database in %s: %w", dir, err)
	}
	return &Engine{db: db}, nil
}

// Name reports "pebble".
func (e *Engine) Name() string { return "pebble" }

// Update runs fn in a serialized read-write transaction and commits it
// with a sync.
func (e *Engine) Update(ctx context.Context, fn func(kv.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return kv.ErrClosed
	}
	b := e.db.NewIndexedBatch()
	defer b.Close()
	t := &txn{r: b, w: b}
	if err := fn(t); err != nil {
		return err
	}
	if b.Empty() {
		return nil
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("commit metadata transaction: %w", err)
	}
	return nil
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

// Close flushes and closes the database.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	return e.db.Close()
}

type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

type txn struct {
	r reader
	w *pebble.Batch // nil in a view
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
	return t.w.Set(key, value, nil)
}

func (t *txn) Delete(key []byte) error {
	if t.w == nil {
		return kv.ErrReadOnly
	}
	return t.w.Delete(key, nil)
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
