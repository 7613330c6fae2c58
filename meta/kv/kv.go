// Package kv is the narrow transactional key-value interface the metadata
// service keeps all its state in. The namespace is written once over it;
// each engine (embedded pebble, etcd) implements it and must pass the
// conformance suite in kv/kvtest.
package kv

import (
	"context"
	"errors"
)

// ErrConflict is returned by Engine.Update when the transaction collided
// with a concurrent one and was not applied; Update retries it itself a
// bounded number of times before giving up with this error.
var ErrConflict = errors.New("kv: transaction conflict")

// ErrClosed is returned for calls on a closed engine.
var ErrClosed = errors.New("kv: engine closed")

// Engine runs transactions. Implementations are safe for concurrent use.
type Engine interface {
	// Update runs fn in a read-write transaction. If fn returns nil the
	// writes are committed atomically and durably (synced) before Update
	// returns; otherwise nothing is written and fn's error is returned. fn
	// may be called more than once (after a conflict), so it must not have
	// side effects outside the transaction.
	Update(ctx context.Context, fn func(Txn) error) error
	// View runs fn in a read-only transaction that sees a consistent
	// snapshot.
	View(ctx context.Context, fn func(Txn) error) error
	// Name identifies the engine ("pebble", "etcd") for status output.
	Name() string
	// Close releases the engine; pending transactions fail.
	Close() error
}

// Txn is a transaction's view of the store. Reads see the transaction's own
// writes. A Txn must not be used after its function returns.
type Txn interface {
	// Get returns the value of key, or (nil, false) if it is absent. The
	// returned slice must not be modified and is valid only during the
	// transaction.
	Get(key []byte) (value []byte, ok bool, err error)
	// Scan calls fn for each key in [start, end) in ascending order until fn
	// returns false or an error. An empty end means no upper bound. Values
	// passed to fn are valid only during the call.
	Scan(start, end []byte, fn func(key, value []byte) (more bool, err error)) error
	// Set stores value under key. It fails in a read-only transaction.
	Set(key, value []byte) error
	// Delete removes key (absent keys are fine). It fails in a read-only
	// transaction.
	Delete(key []byte) error
}

// MultiGetter is implemented by transactions that read many keys faster
// together than one by one (etcd: one round trip per 100 keys instead of
// one per key). Use GetMany, which falls back to Get for other engines.
type MultiGetter interface {
	// GetMany returns, for each of keys, what Get would return: values[i]
	// and found[i] (nil and false if absent). It is equivalent to calling
	// Get for each key in order, also for what the transaction later
	// checks at commit. Returned slices follow Get's rules.
	GetMany(keys [][]byte) (values [][]byte, found []bool, err error)
}

// GetMany reads keys in t, together if t is a MultiGetter, else one by one
// with Get.
func GetMany(t Txn, keys [][]byte) (values [][]byte, found []bool, err error) {
	if m, ok := t.(MultiGetter); ok {
		return m.GetMany(keys)
	}
	values, found = make([][]byte, len(keys)), make([]bool, len(keys))
	for i, k := range keys {
		if values[i], found[i], err = t.Get(k); err != nil {
			return nil, nil, err
		}
	}
	return values, found, nil
}

// GroupUpdater is implemented by engines that commit several
// transactions handed over together in one go (pebble: one commit group,
// one sync).
type GroupUpdater interface {
	// UpdateAll runs each fns[i] as Update(ctxs[i], fns[i]) would, all
	// submitted at once, and returns each one's outcome.
	UpdateAll(ctxs []context.Context, fns []func(Txn) error) []error
}

// lazyKey marks a context whose transaction may commit lazily (Lazy).
type lazyKey struct{}

// Lazy marks ctx so that Update may return once the transaction's writes
// are committed and visible, before they are synced: they become durable
// with the next synced commit, and a crash before it may lose them (never
// a part of them, and never a later synced transaction without them).
// Engines without lazy commits (LazyCommitter) sync as always. For
// records that can be restored after a crash, such as the opens clients
// replay.
func Lazy(ctx context.Context) context.Context { return context.WithValue(ctx, lazyKey{}, true) }

// IsLazy reports whether ctx was marked with Lazy.
func IsLazy(ctx context.Context) bool { v, _ := ctx.Value(lazyKey{}).(bool); return v }

// LazyCommitter is implemented by engines that honour Lazy: what they
// acknowledged may be lost by a crash.
type LazyCommitter interface {
	// LazyCommits reports whether Lazy transactions commit unsynced.
	LazyCommits() bool
}

// ErrReadOnly is returned by Set and Delete inside View.
var ErrReadOnly = errors.New("kv: write in a read-only transaction")

// PrefixEnd returns the smallest key greater than every key with prefix p,
// for use as a Scan end bound; nil if there is none.
func PrefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
