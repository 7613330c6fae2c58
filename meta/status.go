package meta

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// statfsBlockSize is the block size StatFS reports.
const statfsBlockSize = 4096

// StatFS reports the data servers' capacity and the number of inodes.
// Sizes are divided by the default layout's replica count: what files of
// that layout can hold.
func (s *Service) StatFS(ctx context.Context, _ *weftv1.StatFSRequest) (*weftv1.StatFSResponse, error) {
	total, free, _ := s.cluster.Capacity()
	if r := uint64(s.cfg.DefaultLayout.GetReplicas()); r > 1 {
		total, free = total/r, free/r
	}
	var files, dirs uint64
	err := s.view(ctx, func(x *tx) error {
		n, err := readCounts(x.t)
		files, dirs = n.files, n.dirs
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("statfs: %w", err)
	}
	return &weftv1.StatFSResponse{
		TotalBytes: total, FreeBytes: free, AvailBytes: free,
		Files: files + dirs, BlockSize: statfsBlockSize,
	}, nil
}

// Status reports the cluster's health at a glance.
func (s *Service) Status(ctx context.Context, _ *weftv1.StatusRequest) (*weftv1.StatusResponse, error) {
	resp := &weftv1.StatusResponse{
		ClusterId:     s.clusterID,
		Engine:        s.eng.Name(),
		Servers:       s.cluster.Servers(),
		Chains:        uint64(s.cluster.NumChains()),
		DefaultLayout: s.cfg.DefaultLayout,
	}
	resp.TotalBytes, resp.FreeBytes, resp.UsedBytes = s.cluster.Capacity()
	h := s.cluster.Health()
	resp.ChainSummaries, resp.Warnings, resp.ChainList = h.Summaries, h.Warnings, h.Chains
	resp.SyncBytesLeft, resp.SyncEtaMs = h.SyncBytesLeft, h.SyncETA.Milliseconds()
	if h.SyncETA < 0 {
		resp.SyncEtaMs = -1 // bytes are left but the rate is not known yet
	}
	if left := time.Unix(0, s.graceUntil).Sub(s.now()); s.graceUntil > 0 && left > 0 {
		resp.OpenGraceLeftMs = max(left.Milliseconds(), 1)
	}
	err := s.view(ctx, func(x *tx) error {
		n, err := readCounts(x.t)
		if err != nil {
			return err
		}
		resp.Files, resp.Directories = n.files, n.dirs
		if resp.Sessions, err = countPrefix(x.t, prefixSession); err != nil {
			return err
		}
		if resp.SessionList, err = x.sessionList(); err != nil {
			return err
		}
		resp.GcPending, err = countPrefix(x.t, prefixGC)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return resp, nil
}

func countPrefix(t kv.Txn, prefix []byte) (uint64, error) {
	var n uint64
	err := t.Scan(prefix, kv.PrefixEnd(prefix), func(_, _ []byte) (bool, error) {
		n++
		return true, nil
	})
	return n, err
}

// RegisterServer registers a data server with the cluster manager.
func (s *Service) RegisterServer(ctx context.Context, req *weftv1.RegisterServerRequest) (*weftv1.RegisterServerResponse, error) {
	return s.cluster.RegisterServer(ctx, req)
}

// ReportSynced passes a syncing chain member's report that it caught up
// to the cluster manager, which makes it serving.
func (s *Service) ReportSynced(ctx context.Context, req *weftv1.ReportSyncedRequest) (*weftv1.ReportSyncedResponse, error) {
	return s.cluster.ReportSynced(ctx, req)
}

// RemoveTarget takes a target out of service: the cluster manager
// replaces it in its chains.
func (s *Service) RemoveTarget(ctx context.Context, req *weftv1.RemoveTargetRequest) (*weftv1.RemoveTargetResponse, error) {
	n, err := s.cluster.RemoveTarget(ctx, req.TargetId)
	if err != nil {
		return nil, err
	}
	return &weftv1.RemoveTargetResponse{ChainsChanged: n}, nil
}

// Heartbeat passes a data server's heartbeat to the cluster manager.
func (s *Service) Heartbeat(ctx context.Context, req *weftv1.HeartbeatRequest) (*weftv1.HeartbeatResponse, error) {
	return s.cluster.Heartbeat(ctx, req)
}

// GetChains returns the chain table.
func (s *Service) GetChains(ctx context.Context, req *weftv1.GetChainsRequest) (*weftv1.ChainTable, error) {
	return s.cluster.GetChains(ctx, req)
}

// GC retry backoff for a file whose chunks could not be deleted.
const (
	gcInterval   = time.Second
	gcMinBackoff = time.Second
	gcMaxBackoff = time.Minute
	gcBatch      = 256
)

type gcRetry struct {
	at      time.Time
	backoff time.Duration
}

// gcLoop deletes queued files' chunks until ctx is done.
func (s *Service) gcLoop(ctx context.Context) {
	t := time.NewTicker(gcInterval)
	defer t.Stop()
	for {
		if !s.ha.managing() {
			// Only the elected cluster manager collects (ha.go).
		} else if _, err := s.collectGarbage(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("garbage collection of deleted files", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// collectGarbage makes one pass over the GC queue: for each queued file
// not in backoff it has the data servers delete its chunks and, on
// success, removes it from the queue. It returns how many were collected.
// An entry whose inode still exists is left alone (its chunks are a live
// file's: only damage to the metadata makes such an entry) and logged
// once; weft fsck reports it and --repair drops it.
func (s *Service) collectGarbage(ctx context.Context) (int, error) {
	type item struct {
		ino    uint64
		layout *weftv1.Layout
	}
	var items []item
	var live, recheck []uint64
	err := s.view(ctx, func(x *tx) error {
		items, live, recheck = items[:0], live[:0], recheck[:0]
		err := x.t.Scan(prefixGC, kv.PrefixEnd(prefixGC), func(k, v []byte) (bool, error) {
			ino, err := inoFromKeySuffix(k)
			if err != nil {
				return false, err
			}
			s.gcMu.Lock()
			known := s.gcLive[ino]
			s.gcMu.Unlock()
			if known {
				// Found live before: it does not take a place in the
				// batch (a batch of them would starve the queue), but is
				// looked at again in case the file has gone since.
				recheck = append(recheck, ino)
				return true, nil
			}
			l := new(weftv1.Layout)
			if err := proto.Unmarshal(v, l); err != nil {
				return false, fmt.Errorf("corrupt GC queue entry for inode %d: %w", ino, err)
			}
			items = append(items, item{ino, l})
			return len(items) < gcBatch, nil
		})
		if err != nil || len(items)+len(recheck) == 0 {
			return err
		}
		keys := make([][]byte, 0, len(items)+len(recheck))
		for _, it := range items {
			keys = append(keys, inodeKey(it.ino))
		}
		for _, ino := range recheck {
			keys = append(keys, inodeKey(ino))
		}
		_, found, err := kv.GetMany(x.t, keys)
		if err != nil {
			return err
		}
		queued := items[:0]
		for i, it := range items {
			if found[i] {
				live = append(live, it.ino)
			} else {
				queued = append(queued, it)
			}
		}
		gone := recheck[:0]
		for i, ino := range recheck {
			if !found[len(items)+i] {
				gone = append(gone, ino)
			}
		}
		items, recheck = queued, gone
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.gcMu.Lock()
	for _, ino := range recheck {
		delete(s.gcLive, ino) // deleted since: collected on the next pass
	}
	s.gcMu.Unlock()
	for _, ino := range live {
		s.gcMu.Lock()
		s.gcLive[ino] = true
		s.gcMu.Unlock()
		s.log.Error("a file in the garbage collection queue still exists: its chunks are kept; run weft fsck --repair to drop the entry", "ino", ino)
	}
	done := 0
	for _, it := range items {
		if ctx.Err() != nil {
			return done, ctx.Err()
		}
		now := time.Now()
		s.gcMu.Lock()
		r, waiting := s.gcRetryAt[it.ino]
		s.gcMu.Unlock()
		if waiting && now.Before(r.at) {
			continue
		}
		if err := s.cluster.DeleteFile(ctx, it.ino, it.layout); err != nil {
			r.backoff = min(max(2*r.backoff, gcMinBackoff), gcMaxBackoff)
			r.at = now.Add(r.backoff)
			s.gcMu.Lock()
			s.gcRetryAt[it.ino] = r
			s.gcMu.Unlock()
			s.log.Warn("could not delete a deleted file's chunks; will retry", "ino", it.ino, "retry_in", r.backoff, "err", err)
			continue
		}
		s.gcMu.Lock()
		delete(s.gcRetryAt, it.ino)
		s.gcMu.Unlock()
		err := s.update(ctx, func(x *tx) error { return x.t.Delete(gcKey(it.ino)) })
		if err != nil {
			return done, fmt.Errorf("remove inode %d from the GC queue: %w", it.ino, err)
		}
		done++
	}
	return done, nil
}
