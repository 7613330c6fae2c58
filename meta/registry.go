package meta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// The registry of meta servers lives in etcd next to the metadata, under
// <prefix>ha/meta/<id>: one JSON record per live meta server, attached to
// the lease of its election session, so it vanishes within the election
// TTL when the process dies. The election itself uses <prefix>ha/manager/.
const (
	registryDir = "ha/meta/"
	electionDir = "ha/manager/"
	// registryCacheFor: how long a read of the registry is reused.
	registryCacheFor = time.Second
	// metaIDFile holds a meta server's id in its directory.
	metaIDFile = "meta-id"
)

// metaRecord is what a meta server publishes about itself.
type metaRecord struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Version string `json:"version,omitempty"`
	// Seen is when it last renewed the record (Unix milliseconds).
	Seen int64 `json:"seen"`
}

// MetaServerID returns the id of the meta server using directory dir,
// made and saved there (file meta-id) on first use.
func MetaServerID(dir string) (string, error) {
	p := filepath.Join(dir, metaIDFile)
	if b, err := os.ReadFile(p); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read the meta server id: %w", err)
	}
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make a meta server id: %w", err)
	}
	id := hex.EncodeToString(b[:])
	if err := os.WriteFile(p, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("save the meta server id in %s: %w", p, err)
	}
	return id, nil
}

// publish writes this meta server's record under lease.
func (h *ha) publish(ctx context.Context, lease clientv3.LeaseID) error {
	rec := metaRecord{ID: h.cfg.ID, Address: h.addr, Version: h.cfg.Version, Seen: time.Now().UnixMilli()}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, h.ttl)
	defer cancel()
	if _, err := h.cli.Put(cctx, h.prefix+registryDir+h.cfg.ID, string(b), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("publish this meta server in etcd: %w", err)
	}
	return nil
}

// members returns the live meta servers (cached for a second), sorted by
// address.
func (h *ha) members(ctx context.Context) ([]metaRecord, error) {
	if h.cli == nil {
		return []metaRecord{{ID: h.cfg.ID, Address: h.addr, Version: h.cfg.Version, Seen: time.Now().UnixMilli()}}, nil
	}
	h.regMu.Lock()
	defer h.regMu.Unlock()
	if time.Since(h.regAt) < registryCacheFor && h.reg != nil {
		return h.reg, nil
	}
	cctx, cancel := context.WithTimeout(ctx, h.ttl)
	defer cancel()
	resp, err := h.cli.Get(cctx, h.prefix+registryDir, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the registry of meta servers from etcd: %w", err)
	}
	recs := make([]metaRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r metaRecord
		if json.Unmarshal(kv.Value, &r) == nil && r.Address != "" {
			recs = append(recs, r)
		}
	}
	slices.SortFunc(recs, func(a, b metaRecord) int { return strings.Compare(a.Address, b.Address) })
	h.reg, h.regAt = recs, time.Now()
	h.notePeers(recs)
	return recs, nil
}

// metaAddresses lists the addresses of the live meta servers, this one
// first; with the registry unreadable, this one alone.
func (h *ha) metaAddresses(ctx context.Context) []string {
	out := []string{h.addr}
	recs, err := h.members(ctx)
	if err != nil {
		return out
	}
	for _, r := range recs {
		if r.Address != h.addr {
			out = append(out, r.Address)
		}
	}
	return out
}

// metaServers describes the live meta servers for Status, marking the
// elected manager.
func (h *ha) metaServers(ctx context.Context) []*weftv1.MetaServerStatus {
	leaderID, _ := h.leader()
	recs, err := h.members(ctx)
	if err != nil {
		h.log.Warn("cannot list the meta servers", "err", err)
	}
	now := time.Now().UnixMilli()
	out := make([]*weftv1.MetaServerStatus, 0, len(recs))
	for _, r := range recs {
		out = append(out, &weftv1.MetaServerStatus{
			Id: r.ID, Address: r.Address, Version: r.Version,
			Manager: r.ID == leaderID, LastSeenMs: max(now-r.Seen, 0),
		})
	}
	return out
}
