package data

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

const (
	defaultHeartbeatInterval = time.Second
	metaCallTimeout          = 5 * time.Second
	minRetryDelay            = 250 * time.Millisecond
	maxRetryDelay            = time.Second
	minRefreshSpacing        = 100 * time.Millisecond
	gracefulStopTimeout      = 5 * time.Second
)

// Serve runs the Data gRPC service on lis and the register/heartbeat loop
// with the meta service until ctx is done, then stops gracefully and closes
// the store. A meta service that is down is retried with backoff (logged
// clearly), never fatal.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	gs := rpc.NewServer()
	weftv1.RegisterDataServer(gs, dataService{s})
	addr := s.advertiseAddr(lis)
	gl, wl, wireAddr := s.listenWire(lis, addr)
	var err error
	s.mu.Lock()
	s.wireAddr = wireAddr
	s.mu.Unlock()
	ws := wire.NewServer(s, s.log)

	loopCtx, stopLoop := context.WithCancel(ctx)
	s.bgMu.Lock()
	s.bgCtx = loopCtx
	s.bgMu.Unlock()
	var loop sync.WaitGroup
	loop.Go(func() { s.metaLoop(loopCtx, addr) })
	loop.Go(func() { s.syncLoop(loopCtx) })
	loop.Go(func() { s.scrubLoop(loopCtx) })
	loop.Go(func() { s.flushLoop(loopCtx) })
	served := make(chan error, 2)
	go func() { served <- gs.Serve(gl) }()
	if wl != nil {
		go func() {
			if err := ws.Serve(wl); err != nil {
				served <- err
			}
		}()
	}
	s.log.Info("data server started", "listen", lis.Addr().String(), "advertise", addr,
		"wire_address", wireAddr, "incarnation", s.incarnation, "targets", s.cfg.Targets, "meta", s.cfg.MetaAddr)

	select {
	case <-ctx.Done():
	case err = <-served:
		err = fmt.Errorf("serve data service on %s: %w", lis.Addr(), err)
	}
	stopLoop()
	loop.Wait()
	stopGracefully(gs, gracefulStopTimeout)
	ws.Close(gracefulStopTimeout)
	if cerr := s.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close data server: %w", cerr)
	}
	return err
}

// stopGracefully lets running RPCs finish for up to timeout, then cuts the
// rest.
func stopGracefully(gs *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		gs.Stop()
		<-done
	}
}

// advertiseAddr is the address reported to the meta service: the
// configured one, else the listener's, with an unspecified IP (0.0.0.0,
// ::) replaced by the host name.
func (s *Server) advertiseAddr(lis net.Listener) string {
	if s.cfg.Advertise != "" {
		return s.cfg.Advertise
	}
	addr := lis.Addr().String()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		name, err := os.Hostname()
		if err != nil {
			return addr
		}
		addr = net.JoinHostPort(name, port)
		s.log.Warn("data server listens on all interfaces; advertising the host name to clients (set an advertise address if it does not resolve for them)",
			"advertise", addr)
	}
	return addr
}

// metaLoop registers with the meta service, then heartbeats every interval
// the registration asked for, installing the chain table of every answer.
// Failures are retried with capped backoff and logged once per change of
// state, not once per attempt.
func (s *Server) metaLoop(ctx context.Context, addr string) {
	meta := weftv1.NewMetaClient(s.metaConn)
	registered := false
	interval := defaultHeartbeatInterval
	retry := minRetryDelay
	var failing string // last failure logged; "" while the meta service answers
	for {
		var err error
		began := time.Now()
		if !registered {
			if interval, err = s.register(ctx, meta, addr); err == nil {
				registered = true
			}
		} else {
			var unknown bool
			if unknown, err = s.heartbeat(ctx, meta, addr); err == nil && unknown {
				s.log.Warn("meta service does not know this data server (its state was reset?); registering again",
					"meta", s.cfg.MetaAddr)
				registered = false
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		// Heartbeats are spaced from send to send, so a slow answer does
		// not push the next one towards the fencing deadline.
		delay := max(interval-time.Since(began), 0)
		refresh := s.refresh
		if err != nil {
			if msg := metaFailure(s.cfg.MetaAddr, registered, err); msg != failing {
				s.log.Warn(msg + fmt.Sprintf("; retrying every %s", maxRetryDelay))
				failing = msg
			}
			delay, retry = retry, min(2*retry, maxRetryDelay)
			refresh = nil
			// gRPC's own reconnect backoff grows to minutes while the
			// meta service is unreachable; without this a server cut off
			// for a while would stay fenced long after the network heals.
			s.metaConn.ResetConnectBackoff()
		} else {
			if failing != "" {
				s.log.Info("meta service reachable again", "meta", s.cfg.MetaAddr)
				failing = ""
			}
			retry = minRetryDelay
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-refresh:
			timer.Stop()
			time.Sleep(minRefreshSpacing)
		}
	}
}

// metaFailure describes a failed call to the meta service for a person.
func metaFailure(metaAddr string, registered bool, err error) string {
	what := "registration"
	if registered {
		what = "heartbeat"
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Sprintf("%s with meta service at %s failed: %v", what, metaAddr, err)
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Sprintf("cannot reach meta service at %s (is it running? is the address right?): %s", metaAddr, st.Message())
	default:
		return fmt.Sprintf("meta service at %s refused %s: %s (%s)", metaAddr, what, st.Message(), st.Code())
	}
}

// register announces this server and its targets; it installs the target
// ids and chain table of the answer and returns the heartbeat interval.
func (s *Server) register(ctx context.Context, meta weftv1.MetaClient, addr string) (time.Duration, error) {
	host, _ := os.Hostname()
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, metaCallTimeout)
	defer cancel()
	resp, err := meta.RegisterServer(ctx, &weftv1.RegisterServerRequest{
		Uuid:        s.serverUUID,
		Address:     addr,
		WireAddress: s.WireAddr(),
		Incarnation: s.incarnation,
		Hostname:    host,
		Targets:     s.targetReports(),
		Site:        s.cfg.Site,
		Rack:        s.cfg.Rack,
	})
	if err != nil {
		return 0, err
	}
	if n := len(resp.GetTargetIds()); n != len(s.targetUUIDs) {
		return 0, fmt.Errorf("meta service answered %d target ids for %d targets", n, len(s.targetUUIDs))
	}
	s.SetTargetIDs(resp.GetTargetIds())
	if resp.GetChains() != nil {
		s.SetChains(resp.GetChains())
	}
	interval := time.Duration(resp.GetHeartbeatIntervalMs()) * time.Millisecond
	if interval <= 0 {
		interval = defaultHeartbeatInterval
	}
	ft := failureTimeoutFor(resp.GetFailureTimeoutMs(), interval)
	s.mu.Lock()
	s.failureTimeout = ft
	s.mu.Unlock()
	s.noteContact(sent)
	// At least two heartbeats fit in the time before the server fences
	// itself, so one lost answer does not cut it off.
	interval = min(interval, ft/4)
	s.log.Info("registered with meta service", "meta", s.cfg.MetaAddr, "server_id", resp.GetServerId(),
		"target_ids", resp.GetTargetIds(), "address", addr, "incarnation", s.incarnation, "heartbeat", interval, "fence_after", s.failureTimeout/2)
	s.mu.Lock()
	s.serverID = resp.GetServerId()
	s.mu.Unlock()
	return interval, nil
}

// heartbeat reports the targets and installs the chain table of the
// answer; unknown is true if the meta service asks to register again.
func (s *Server) heartbeat(ctx context.Context, meta weftv1.MetaClient, addr string) (unknown bool, err error) {
	s.mu.RLock()
	id := s.serverID
	s.mu.RUnlock()
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, metaCallTimeout)
	defer cancel()
	resp, err := meta.Heartbeat(ctx, &weftv1.HeartbeatRequest{ServerId: id, Address: addr, WireAddress: s.WireAddr(),
		Incarnation: s.incarnation, Targets: s.targetReports(), ForwardFailures: s.forwards.report()})
	if err != nil {
		return false, err
	}
	if resp.GetUnknownServer() {
		return true, nil
	}
	if resp.GetChains() != nil {
		s.SetChains(resp.GetChains())
	}
	s.noteContact(sent)
	return false, nil
}

// targetReports describes every target: identity, path, capacity, usage,
// scrub counters and resyncs in progress.
func (s *Server) targetReports() []*weftv1.TargetReport {
	var reports []*weftv1.TargetReport
	s.mu.RLock()
	ids := append([]uint64(nil), s.targetIDs...)
	s.mu.RUnlock()
	for i, t := range s.store.Targets() {
		r := &weftv1.TargetReport{Uuid: s.targetUUIDs[i], Path: t.Dir()}
		u, err := t.Usage()
		if err != nil {
			s.log.Warn("cannot measure target capacity", "target", t.Dir(), "err", err)
		}
		r.TotalBytes, r.FreeBytes, r.UsedBytes, r.Chunks = u.TotalBytes, u.FreeBytes, u.UsedBytes, u.Chunks
		r.Filesystem = u.Filesystem
		r.ScrubbedBytes, r.ScrubErrors, r.ScrubRepaired = s.stats[i].scrubbed.Load(), s.stats[i].errors.Load(), s.stats[i].repaired.Load()
		if i < len(ids) {
			r.Syncs = s.syncReports(ids[i])
		}
		s.faultReport(t, r)
		reports = append(reports, r)
	}
	return reports
}
