// Package etcdkv is the metadata engine for several meta servers sharing
// one etcd cluster (etcd v3 API). All keys live under a prefix (default
// "/weft/"), so one etcd cluster can hold several weft clusters.
//
// Transactions are optimistic and serializable. Update runs fn against a
// snapshot: the first read fixes a revision R and every later read in the
// transaction is served at R (Get with WithRev(R)); reads are cached, writes
// buffered, reads see the transaction's own writes and Scan merges the
// buffered writes into the snapshot's range. The commit is one etcd Txn
// whose If holds, for every key read, "its ModRevision is the one seen"
// (0 for a key that was absent), and for every scanned range "no key in it
// was modified after R" (a range compare); its Then holds the buffered puts
// and deletes. Keys returned by a scan also get their own compare, so a
// key deleted from a scanned range after R is a conflict too. If any
// compare fails, fn runs again on a fresh snapshot after a jittered
// backoff, up to Options.MaxAttempts times; then Update returns
// kv.ErrConflict. An Update that writes nothing commits nothing. GetMany
// (kv.MultiGetter) reads many keys at the snapshot in etcd Txns of 100 Gets
// each, one round trip per 100 keys, recorded for the commit as Get does.
//
// Limits: an etcd server accepts at most --max-txn-ops (default 128)
// compares, and as many writes, in one Txn, and requests of at most
// --max-request-bytes (default 1.5 MiB). A transaction that reads or
// writes more keys than that fails with an error naming the flag. Namespace
// operations stay far below it (a create reads 4 keys, a rename fewer than
// 20); those that touch a few keys per item (ending a session with many
// open files, renewing every session at start-up) split the work into
// transactions that stay below it, so the default is enough. Only deleting
// a file with very many extended attributes (60 or more) may need a larger
// --max-txn-ops.
// Keep the etcd history compacted (e.g. --auto-compaction-mode=revision
// --auto-compaction-retention=10000): a transaction whose snapshot was
// compacted away is retried like a conflict (a View fails).
//
// The first read of a transaction is linearizable (it fixes the snapshot
// at the cluster's latest revision); later reads at that revision are
// serializable, served by the member the client talks to without a
// consensus round. View reads a snapshot the same way and never retries.
package etcdkv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/weft-fs/weft/meta/kv"
)

// Defaults of Options.
const (
	DefaultPrefix         = "/weft/"
	defaultDialTimeout    = 5 * time.Second
	defaultRequestTimeout = 10 * time.Second
	defaultMaxAttempts    = 50
	scanPage              = 512
	backoffBase           = 2 * time.Millisecond
	backoffCap            = 100 * time.Millisecond
)

// Options configure an Engine.
type Options struct {
	// Endpoints are the etcd client endpoints (host:port or URLs).
	Endpoints []string
	// Prefix is prepended to every key; default DefaultPrefix.
	Prefix string
	// DialTimeout bounds connecting and the start-up health check;
	// default 5s.
	DialTimeout time.Duration
	// RequestTimeout bounds every etcd call; default 10s.
	RequestTimeout time.Duration
	// MaxAttempts is how often Update runs fn before it gives up with
	// kv.ErrConflict; default 50.
	MaxAttempts int
}

// Engine is a kv.Engine over an etcd cluster. It is safe for concurrent
// use, also by several processes over the same etcd and prefix.
type Engine struct {
	cli    *clientv3.Client
	prefix string
	opts   Options
	closed atomic.Bool
	// retryToken is held by the one transaction of this engine that may
	// retry after a conflict.
	retryToken chan struct{}
	// guard: compares every commit must also pass (see Guarded); shared:
	// the client belongs to another Engine and Close leaves it open.
	guard  []clientv3.Cmp
	shared bool
}

// Open connects to etcd and checks that at least one endpoint answers.
func Open(ctx context.Context, opts Options) (*Engine, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("etcd engine: no endpoints given (e.g. --etcd-endpoints 127.0.0.1:2379)")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = defaultDialTimeout
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = defaultRequestTimeout
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = defaultMaxAttempts
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		DialTimeout: opts.DialTimeout,
		Logger:      zap.NewNop(),
		// Reconnect within seconds after an outage of any length (gRPC's
		// default backoff grows to 2 minutes): a meta server cut off from
		// etcd must rejoin soon after the network heals.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcd engine: connect to %s: %w", strings.Join(opts.Endpoints, ","), err)
	}
	e := &Engine{cli: cli, prefix: opts.Prefix, opts: opts, retryToken: make(chan struct{}, 1)}
	if err := e.probe(ctx); err != nil {
		cli.Close()
		return nil, err
	}
	return e, nil
}

// probe asks every endpoint for its status at once; it fails if none
// answers, naming each endpoint's error.
func (e *Engine) probe(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, e.opts.DialTimeout)
	defer cancel()
	errs := make([]error, len(e.opts.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range e.opts.Endpoints {
		wg.Go(func() { _, errs[i] = e.cli.Status(cctx, ep) })
	}
	wg.Wait()
	var failed []string
	for i, err := range errs {
		if err == nil {
			return nil
		}
		failed = append(failed, fmt.Sprintf("%s: %v", e.opts.Endpoints[i], err))
	}
	return fmt.Errorf("etcd engine: no etcd endpoint answered within %v (%s); start the etcd cluster or fix --etcd-endpoints",
		e.opts.DialTimeout, strings.Join(failed, "; "))
}

// Name reports "etcd".
func (e *Engine) Name() string { return "etcd" }

// Close closes the etcd client; later calls return kv.ErrClosed.
func (e *Engine) Close() error {
	if e.closed.Swap(true) || e.shared {
		return nil
	}
	return e.cli.Close()
}

// errRetry marks a read that cannot be served at the snapshot (compacted
// history): the transaction is retried on a fresh snapshot.
var errRetry = fmt.Errorf("etcd snapshot revision was compacted: %w", kv.ErrConflict)

// Update runs fn in an optimistic serializable transaction, retrying it on
// conflicts (see the package documentation). The first attempt runs
// concurrently with everything else; a transaction that conflicted retries
// holding the engine's retry token, so the transactions of one process
// that collide (the inode counter of every create, say) take turns instead
// of colliding again, while the first attempts of others still overlap.
func (e *Engine) Update(ctx context.Context, fn func(kv.Txn) error) error {
	holding := false
	defer func() {
		if holding {
			<-e.retryToken
		}
	}()
	for attempt := 1; ; attempt++ {
		if e.closed.Load() {
			return kv.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		done, err := e.attempt(ctx, fn)
		if done {
			return err
		}
		if attempt >= e.opts.MaxAttempts {
			return fmt.Errorf("etcd transaction still conflicting after %d attempts: %w", attempt, kv.ErrConflict)
		}
		if !holding {
			select {
			case e.retryToken <- struct{}{}:
				holding = true
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		// Still conflicting (with another process): full jitter, a random
		// time up to base * 2^attempt.
		d := rand.N(min(backoffCap, backoffBase<<min(attempt, 10)))
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// attempt runs fn once and commits; done is false after a conflict.
func (e *Engine) attempt(ctx context.Context, fn func(kv.Txn) error) (done bool, err error) {
	t := e.newTxn(ctx, false)
	if err := fn(t); err != nil {
		return !errors.Is(err, errRetry), err
	}
	if len(t.writes) == 0 {
		return true, nil
	}
	committed, err := t.commit()
	return committed || err != nil, err
}

// View runs fn against a snapshot; fn runs once.
func (e *Engine) View(ctx context.Context, fn func(kv.Txn) error) error {
	if e.closed.Load() {
		return kv.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn(e.newTxn(ctx, true))
}

// wrap adds what failed and what to do to an etcd error.
func (e *Engine) wrap(ctx context.Context, what string, err error) error {
	switch {
	case e.closed.Load():
		return kv.ErrClosed
	case ctx.Err() != nil:
		return fmt.Errorf("etcd %s: %w", what, ctx.Err())
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("etcd %s: the transaction has more operations than the etcd server's --max-txn-ops allows; restart etcd with a larger --max-txn-ops (e.g. 4096): %w", what, err)
	case isCompacted(err):
		return fmt.Errorf("etcd %s: the snapshot was compacted away while the transaction ran; try again: %w", what, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Errorf("etcd %s: the transaction is larger than the etcd server's --max-request-bytes; restart etcd with a larger limit: %w", what, err)
	}
	return fmt.Errorf("etcd %s at %s: %w; check that the etcd cluster is running and reachable from this host",
		what, strings.Join(e.opts.Endpoints, ","), err)
}

func isCompacted(err error) bool {
	return errors.Is(err, rpctypes.ErrCompacted)
}

// read is a key's value at the snapshot; mod is its ModRevision (0 if
// absent).
type read struct {
	val []byte
	ok  bool
	mod int64
}

// write is a buffered Set (del false) or Delete.
type write struct {
	val []byte
	del bool
}

// keyRange is a scanned range [start, end) of full keys.
type keyRange struct{ start, end string }

// txn is one attempt of a transaction. Keys in its maps are full etcd
// keys (prefix included).
type txn struct {
	e        *Engine
	ctx      context.Context
	readOnly bool
	rev      int64 // snapshot revision; 0 until the first read
	reads    map[string]read
	writes   map[string]write
	ranges   []keyRange
}

func (e *Engine) newTxn(ctx context.Context, readOnly bool) *txn {
	return &txn{e: e, ctx: ctx, readOnly: readOnly, reads: map[string]read{}, writes: map[string]write{}}
}

// get runs one etcd range read at the snapshot, fixing the snapshot on
// the first call.
func (t *txn) get(key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if t.e.closed.Load() {
		return nil, kv.ErrClosed
	}
	cctx, cancel := context.WithTimeout(t.ctx, t.e.opts.RequestTimeout)
	defer cancel()
	var resp *clientv3.GetResponse
	var err error
	if t.rev > 0 {
		// A read at a fixed revision needs no consensus round: served by
		// the member the client talks to, unless that member has not
		// applied the revision yet; then read through the leader.
		opts = append(opts, clientv3.WithRev(t.rev))
		resp, err = t.e.cli.Get(cctx, key, append(opts, clientv3.WithSerializable())...)
		if errors.Is(err, rpctypes.ErrFutureRev) {
			resp, err = t.e.cli.Get(cctx, key, opts...)
		}
	} else {
		resp, err = t.e.cli.Get(cctx, key, opts...)
	}
	if err != nil {
		if isCompacted(err) && !t.readOnly {
			return nil, errRetry
		}
		return nil, t.e.wrap(t.ctx, "read", err)
	}
	if t.rev == 0 {
		t.rev = resp.Header.Revision
	}
	return resp, nil
}

func (t *txn) Get(key []byte) ([]byte, bool, error) {
	k := t.e.prefix + string(key)
	if w, ok := t.writes[k]; ok {
		return w.val, !w.del, nil
	}
	if r, ok := t.reads[k]; ok {
		return r.val, r.ok, nil
	}
	resp, err := t.get(k)
	if err != nil {
		return nil, false, err
	}
	var r read
	if len(resp.Kvs) > 0 {
		r = read{val: resp.Kvs[0].Value, ok: true, mod: resp.Kvs[0].ModRevision}
		if r.val == nil {
			r.val = []byte{}
		}
	}
	t.reads[k] = r
	return r.val, r.ok, nil
}

func (t *txn) Scan(start, end []byte, fn func(key, value []byte) (bool, error)) error {
	lo := t.e.prefix + string(start)
	hi := t.e.prefix + string(end)
	if len(end) == 0 {
		hi = string(kv.PrefixEnd([]byte(t.e.prefix)))
	}
	if hi != "" && lo >= hi {
		return nil
	}
	rangeEnd := hi
	if rangeEnd == "" {
		rangeEnd = "\x00" // etcd: every key >= lo
	}
	// Buffered writes in the range, in key order.
	var pending []string
	for k := range t.writes {
		if k >= lo && (hi == "" || k < hi) {
			pending = append(pending, k)
		}
	}
	sort.Strings(pending)
	seenTo := hi // upper bound of what this scan observed
	stopped := false
	emit := func(k string, v []byte) error {
		more, err := fn([]byte(k[len(t.e.prefix):]), v)
		if err != nil || !more {
			stopped = true
			seenTo = k + "\x00"
		}
		return err
	}
	var ferr error
	from := lo
scan:
	for {
		resp, err := t.get(from, clientv3.WithRange(rangeEnd), clientv3.WithLimit(scanPage))
		if err != nil {
			return err
		}
		for _, kvp := range resp.Kvs {
			k := string(kvp.Key)
			for len(pending) > 0 && pending[0] < k {
				if w := t.writes[pending[0]]; !w.del {
					if ferr = emit(pending[0], w.val); stopped {
						break scan
					}
				}
				pending = pending[1:]
			}
			if !t.readOnly {
				t.reads[k] = read{val: kvp.Value, ok: true, mod: kvp.ModRevision}
			}
			v := kvp.Value
			if len(pending) > 0 && pending[0] == k {
				w := t.writes[k]
				pending = pending[1:]
				if w.del {
					continue
				}
				v = w.val
			}
			if ferr = emit(k, v); stopped {
				break scan
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	for !stopped && len(pending) > 0 {
		if w := t.writes[pending[0]]; !w.del {
			ferr = emit(pending[0], w.val)
		}
		pending = pending[1:]
	}
	if !t.readOnly && t.rev > 0 {
		t.ranges = append(t.ranges, keyRange{lo, seenTo})
	}
	return ferr
}

func (t *txn) Set(key, value []byte) error {
	if t.readOnly {
		return kv.ErrReadOnly
	}
	t.writes[t.e.prefix+string(key)] = write{val: append([]byte{}, value...)}
	return nil
}

func (t *txn) Delete(key []byte) error {
	if t.readOnly {
		return kv.ErrReadOnly
	}
	t.writes[t.e.prefix+string(key)] = write{del: true}
	return nil
}

// commit sends the transaction as one etcd Txn; false if a compare failed.
func (t *txn) commit() (bool, error) {
	cmps := make([]clientv3.Cmp, 0, len(t.reads)+len(t.ranges))
	for _, k := range sortedKeys(t.reads) {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", t.reads[k].mod))
	}
	for _, r := range t.ranges {
		end := r.end
		if end == "" {
			end = "\x00"
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(r.start), "<", t.rev+1).WithRange(end))
	}
	ops := make([]clientv3.Op, 0, len(t.writes))
	for _, k := range sortedKeys(t.writes) {
		if w := t.writes[k]; w.del {
			ops = append(ops, clientv3.OpDelete(k))
		} else {
			ops = append(ops, clientv3.OpPut(k, string(w.val)))
		}
	}
	if t.e.closed.Load() {
		return false, kv.ErrClosed
	}
	cctx, cancel := context.WithTimeout(t.ctx, t.e.opts.RequestTimeout)
	defer cancel()
	ok, err := t.e.commitTxn(cctx, cmps, ops)
	if errors.Is(err, ErrGuardFailed) {
		return false, err
	}
	if err != nil {
		return false, t.e.wrap(t.ctx, fmt.Sprintf("commit (%d compares, %d writes)", len(cmps), len(ops)), err)
	}
	return ok, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
