package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Disk faults of targets (README.md "Disk faults"). A mutation that fails
// because the target's file system turned read-only (EROFS), because the
// disk failed (EIO other than a checksum mismatch, which is a bad copy
// repaired from a peer) or because it is full (ENOSPC, EDQUOT) marks the
// target; heartbeats report the mark (TargetReport.fault) and the cluster
// manager shows it in status, places no new files on the target, and
// takes a read-only or failed target out of its replicated chains.
// Requesters never see the disk's EROFS: a member with serving peers
// answers Unavailable (the client retries on the chain without it), a
// lone one EIO; a full target answers ENOSPC.
//
// A read-only or failed mark is cleared when a probe (create, write and
// fdatasync a small file in the target, then remove it) succeeds; the
// probe runs in the background at heartbeats while the mark is set. A
// full mark is cleared when a later write to the target succeeds or its
// free space has grown by minFreedToClear.

// Fault kinds, as reported in TargetReport.fault_kind.
const (
	faultReadOnly = "read-only"
	faultFailed   = "failed"
	faultFull     = "full"
)

// minFreedToClear is how much a full target's free space must grow for
// its mark to go without a successful write.
const minFreedToClear = 64 << 20

// probeName is the file the probe of a marked target writes.
const probeName = ".weft-probe"

// targetFault is the disk fault mark of one target.
type targetFault struct {
	mu      sync.Mutex
	kind    string // "" when healthy
	reason  string
	since   time.Time
	freeAt  uint64 // free bytes when a full mark was set
	probing bool
}

// faultKindOf classifies the error of an operation on a local target.
func faultKindOf(err error) string {
	switch {
	case err == nil, errors.Is(err, chunk.ErrCorrupt):
		return ""
	case errors.Is(err, syscall.EROFS):
		return faultReadOnly
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return faultFull
	case errors.Is(err, syscall.EIO):
		return faultFailed
	}
	return ""
}

// diskError turns the error of a mutation of member m's target into what
// the requester gets, marking the target if its disk is at fault. what
// names the operation.
func (s *Server) diskError(m member, what string, err error) error {
	kind := faultKindOf(err)
	if kind == "" {
		return err
	}
	s.markFault(m.target, kind, err)
	where := fmt.Sprintf("%s: target %d (%s) on data server %d", what, m.targetID, m.target.Dir(), s.id())
	switch {
	case kind == faultFull:
		return fserr.Wrap(syscall.ENOSPC, "%s is full (%v): free space on it or add targets", where, err)
	case len(m.servingPeers()) > 0:
		return status.Errorf(codes.Unavailable, "%s: its disk is %s (%v): the target leaves its chains; retry on the other replicas",
			where, kind, err)
	}
	return fserr.Wrap(syscall.EIO, "%s: its disk is %s (%v); it holds the only copy: repair or replace the disk (weft status shows it)",
		where, kind, err)
}

// id is the server's id from the meta service (0 before registration).
func (s *Server) id() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.serverID
}

// markFault sets target t's mark (a read-only or failed mark is not
// replaced by a full one).
func (s *Server) markFault(t *chunk.Target, kind string, err error) {
	f := &s.statsOf(t).fault
	f.mu.Lock()
	if f.kind == kind || (kind == faultFull && f.kind != "") {
		f.mu.Unlock()
		return
	}
	f.kind, f.reason, f.since = kind, err.Error(), time.Now()
	if kind == faultFull {
		if u, uerr := t.Usage(); uerr == nil {
			f.freeAt = u.FreeBytes
		}
	}
	f.mu.Unlock()
	s.log.Error("target marked "+kind+": no new files go to it; weft status shows it", "target", t.Dir(), "err", err)
	s.askRefresh() // tell the meta service now
}

// noteWritten clears a full mark of t after a write to it succeeded.
func (s *Server) noteWritten(t *chunk.Target) {
	f := &s.statsOf(t).fault
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kind == faultFull {
		f.kind, f.reason = "", ""
		s.log.Info("target takes writes again after it was full", "target", t.Dir())
	}
}

// faultReport fills r's fault fields for target t (position i), checking
// whether a mark can go, and whether the target's file system is mounted
// read-only. Called at each heartbeat.
func (s *Server) faultReport(t *chunk.Target, r *weftv1.TargetReport) {
	f := &s.statsOf(t).fault
	var st unix.Statfs_t
	if unix.Statfs(t.Dir(), &st) == nil && st.Flags&unix.ST_RDONLY != 0 {
		s.markFault(t, faultReadOnly, fmt.Errorf("file system of %s is mounted read-only: %w", t.Dir(), syscall.EROFS))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.kind {
	case "":
		return
	case faultFull:
		if r.FreeBytes >= f.freeAt+minFreedToClear {
			f.kind, f.reason = "", ""
			s.log.Info("target has free space again", "target", t.Dir(), "free", r.FreeBytes)
			return
		}
	default:
		if !f.probing {
			f.probing = true
			go s.probe(t, f)
		}
	}
	r.FaultKind, r.Fault, r.FaultSinceMs = f.kind, f.reason, f.since.UnixMilli()
}

// probe writes, syncs and removes a small file in target t, and clears a
// read-only or failed mark if that works. It runs in the background (a
// failed disk may hang it).
func (s *Server) probe(t *chunk.Target, f *targetFault) {
	err := probeWrite(filepath.Join(t.Dir(), probeName))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probing = false
	if err != nil || f.kind == "" || f.kind == faultFull {
		return
	}
	s.log.Info("target is writable again after its disk was "+f.kind, "target", t.Dir(), "since", f.since.Format(time.RFC3339))
	f.kind, f.reason = "", ""
}

// probeWrite creates path, writes a block, syncs it and removes it.
func probeWrite(path string) error {
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = file.Write(make([]byte, 4096))
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if rerr := os.Remove(path); err == nil {
		err = rerr
	}
	return err
}

// flushEvery is how often chunks written and not synced are synced once
// they are idleFlush old (chunk.Target.SyncIdle).
const (
	flushEvery = 10 * time.Second
	idleFlush  = 30 * time.Second
)

// flushLoop syncs the chunks written without a sync once the kernel had
// time to write them back itself, until ctx is done. A sync that fails
// marks the target's disk as faulty: writes acknowledged on it may not
// be on the disk.
func (s *Server) flushLoop(ctx context.Context) {
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, t := range s.store.Targets() {
			if err := t.SyncIdle(idleFlush); err != nil {
				if kind := faultKindOf(err); kind != "" {
					s.markFault(t, kind, err)
				}
				s.log.Error("sync chunks written a while ago", "target", t.Dir(), "err", err)
			}
		}
	}
}
