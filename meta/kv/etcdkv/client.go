package etcdkv

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrGuardFailed is returned by Update of an engine made by Guarded when
// its guard no longer holds (for the cluster manager: this process is no
// longer the elected manager). Nothing was written.
var ErrGuardFailed = errors.New("etcd transaction guard failed")

// Client returns the engine's etcd client, for what is not a metadata
// transaction: leases, elections, the registry of meta servers. It stays
// owned by the engine (closed by Close).
func (e *Engine) Client() *clientv3.Client { return e.cli }

// Prefix returns the key prefix of the engine (ending in '/'); keys
// outside the metadata (elections, registries) go below it too.
func (e *Engine) Prefix() string { return e.prefix }

// Guarded returns an engine over the same etcd client whose updates commit
// only while every compare of guard holds (e.g. "this election key still
// has the creation revision we won it at"), checked in the same etcd Txn
// as the transaction's own compares. When the guard fails Update returns
// an error wrapping ErrGuardFailed at once, without retrying. Views are
// not guarded. The guarded engine shares the client: closing it does not
// close the client, and it must not be used after e is closed.
func (e *Engine) Guarded(guard ...clientv3.Cmp) *Engine {
	return &Engine{cli: e.cli, prefix: e.prefix, opts: e.opts, retryToken: make(chan struct{}, 1), guard: guard, shared: true}
}

// commitTxn sends one transaction: ops if cmps hold. With a guard, the
// transaction is nested in one whose If is the guard, so a failed guard
// and a failed compare are told apart.
func (e *Engine) commitTxn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (bool, error) {
	if len(e.guard) == 0 {
		resp, err := e.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return false, err
		}
		return resp.Succeeded, nil
	}
	resp, err := e.cli.Txn(ctx).If(e.guard...).Then(clientv3.OpTxn(cmps, ops, nil)).Commit()
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		return false, fmt.Errorf("commit: %w", ErrGuardFailed)
	}
	return resp.Responses[0].GetResponseTxn().GetSucceeded(), nil
}
