package etcdkv

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-fs/weft/meta/kv"
)

// multiGetChunk is how many keys one etcd Txn of GetMany reads; etcd
// accepts at most --max-txn-ops (default 128) operations per Txn.
const multiGetChunk = 100

// GetMany implements kv.MultiGetter: the keys neither written nor read
// before in the transaction are read at the snapshot in etcd Txns of up to
// 100 Get operations each (one round trip per 100 keys). Each key read is
// recorded as Get records it, so an Update commits only if none of them
// changed.
func (t *txn) GetMany(keys [][]byte) ([][]byte, []bool, error) {
	full := make([]string, len(keys))
	var missing []string
	queued := map[string]bool{}
	for i, key := range keys {
		k := t.e.prefix + string(key)
		full[i] = k
		if _, ok := t.writes[k]; ok {
			continue
		}
		if _, ok := t.reads[k]; ok || queued[k] {
			continue
		}
		queued[k] = true
		missing = append(missing, k)
	}
	for len(missing) > 0 {
		n := min(len(missing), multiGetChunk)
		if err := t.getChunk(missing[:n]); err != nil {
			return nil, nil, err
		}
		missing = missing[n:]
	}
	values, found := make([][]byte, len(keys)), make([]bool, len(keys))
	for i, k := range full {
		if w, ok := t.writes[k]; ok {
			values[i], found[i] = w.val, !w.del
			continue
		}
		r := t.reads[k]
		values[i], found[i] = r.val, r.ok
	}
	return values, found, nil
}

// getChunk reads keys (at most multiGetChunk) in one etcd Txn at the
// snapshot, fixing the snapshot if this is the transaction's first read,
// and records them in t.reads.
func (t *txn) getChunk(keys []string) error {
	if t.e.closed.Load() {
		return kv.ErrClosed
	}
	cctx, cancel := context.WithTimeout(t.ctx, t.e.opts.RequestTimeout)
	defer cancel()
	run := func(opts ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
		ops := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			ops[i] = clientv3.OpGet(k, opts...)
		}
		return t.e.cli.Txn(cctx).Then(ops...).Commit()
	}
	var resp *clientv3.TxnResponse
	var err error
	if t.rev > 0 {
		// As in get: a read-only Txn whose reads are all serializable and
		// at a fixed revision is served by the member the client talks
		// to; through the leader if that member lags behind.
		resp, err = run(clientv3.WithRev(t.rev), clientv3.WithSerializable())
		if errors.Is(err, rpctypes.ErrFutureRev) {
			resp, err = run(clientv3.WithRev(t.rev))
		}
	} else {
		resp, err = run()
	}
	if err != nil {
		if isCompacted(err) && !t.readOnly {
			return errRetry
		}
		return t.e.wrap(t.ctx, "read of several keys", err)
	}
	if t.rev == 0 {
		t.rev = resp.Header.Revision
	}
	for i, k := range keys {
		var r read
		if rr := resp.Responses[i].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			r = read{val: rr.Kvs[0].Value, ok: true, mod: rr.Kvs[0].ModRevision}
			if r.val == nil {
				r.val = []byte{}
			}
		}
		t.reads[k] = r
	}
	return nil
}
