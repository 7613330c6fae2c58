package kv

import "context"

// WatchEvent is what a Watcher reports: the keys one committed
// transaction wrote (set or deleted), or that changes may have been
// missed.
type WatchEvent struct {
	// Changes are the writes of one transaction, keys without the
	// engine's own prefix.
	Changes []Change
	// Lost says that changes may have been missed (the watch was cut off
	// and resumed after history was compacted, or started over): whoever
	// caches anything derived from the store must drop it all.
	Lost bool
}

// Watcher is implemented by engines whose store other processes can
// change (etcd, shared by several meta servers). The embedded engine has
// one writer, the process itself, so it needs none: the writer knows its
// own changes.
type Watcher interface {
	// Watch calls fn with the transactions writing keys of keys starting with prefix made
	// by any process after Watch was called, in commit order, until ctx
	// ends; fn runs on one goroutine at a time. When the watch breaks it
	// resumes by itself, calling fn with Lost set if changes may have
	// been missed in between. Watch returns ctx's error when ctx ends.
	Watch(ctx context.Context, prefix []byte, fn func(WatchEvent)) error
}

// Change is one write of a transaction.
type Change struct {
	Key []byte
	// Value is the new value (nil for a delete).
	Value []byte
	// Deleted says the key was deleted.
	Deleted bool
}
