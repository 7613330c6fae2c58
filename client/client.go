// Package client is the weft file system client without FUSE: namespace
// operations against the meta service, striping of file data over chains,
// write-back buffering, writes to each chain's head (retried across a
// failover), and parallel chunk reads from the nearest serving replica.
// The FUSE adapter (package mount), tests, benchmarks and gateways use it.
//
// Consistency is close-to-open across clients and full POSIX within one
// Client: every File of one inode opened through the same Client shares one
// write buffer, reads see buffered writes, and GetAttr reports the buffered
// size. See README.md for the design decisions.
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Defaults of Config.
const (
	DefaultWriteBufferBytes   = 64 << 20
	DefaultReadAheadBytes     = 8 << 20
	DefaultUnavailableTimeout = 30 * time.Second
	// OnUnavailableWait and OnUnavailableFail are the values of
	// Config.OnUnavailable.
	OnUnavailableWait = "wait"
	OnUnavailableFail = "fail"
	// DefaultOnUnavailable is the default of Config.OnUnavailable.
	DefaultOnUnavailable = OnUnavailableFail
	defaultVersion       = "dev"
	// sessionCallTimeout bounds opening and closing the session, so that
	// a meta service that cannot be reached is reported promptly.
	sessionCallTimeout = 15 * time.Second
)

// Config configures a Client.
type Config struct {
	// MetaAddr is the meta service address (host:port), or several
	// separated by commas.
	MetaAddr string
	// MetaAddrs are more meta server addresses (several meta servers over
	// one etcd). The client fails over between all of them and the ones
	// the meta service lists in its session answers (see metaconn.go).
	MetaAddrs []string
	// MountPoint is reported in the session (where the file system is
	// mounted, or a description of the user of the library).
	MountPoint string
	// Logger receives the client's log lines; default slog.Default().
	Logger *slog.Logger
	// Version is reported in the session; default "dev".
	Version string
	// WriteBufferBytes bounds the bytes held in write-back buffers (not yet
	// acknowledged by a data server) over all files of this client; past
	// it, writers flush. Default DefaultWriteBufferBytes (64 MiB).
	WriteBufferBytes int64
	// OnUnavailable says what a data operation does when a chain has no
	// member that can take it (replicas = 1 and its data server is down, or
	// every replica down): OnUnavailableFail ("fail", the default) retries
	// for UnavailableTimeout and then fails with EIO; OnUnavailableWait
	// ("wait") retries until the chain is back, however long that takes
	// (an interrupted system call or a cancelled context still ends it).
	// Replicated chains that lose a member do not get here: the client
	// moves to the remaining members once the cluster manager has taken
	// the dead one out.
	OnUnavailable string
	// UnavailableTimeout is how long a data operation keeps retrying while
	// no member of a chain can take it before it fails with EIO (with
	// OnUnavailable "fail"), and how long a meta service call without a
	// deadline waits for an unreachable meta service. Default
	// DefaultUnavailableTimeout (30 s).
	UnavailableTimeout time.Duration
	// ReadAheadBytes is the largest read-ahead window of a sequential
	// reader near its data servers: the window grows with the stream up
	// to it, fetched as per-chunk pieces in parallel. Far from the
	// servers it may grow further, with their round trip (see farScale).
	// All windows together hold at most raBudgetWindows times it.
	// Default DefaultReadAheadBytes (8 MiB); negative turns read-ahead
	// off.
	ReadAheadBytes int64
	// NoLocalReads turns reads in place off: chunks of data servers on
	// this host are then read through the servers like any other (see
	// localread.go). WEFT_LOCAL_READS=off in the environment does the
	// same.
	NoLocalReads bool
	// OnInvalidate, if set, subscribes the client to the meta service's
	// callbacks (see WatchCallbacks) and receives them.
	OnInvalidate func(*weftv1.Invalidation)
	// CloseSync makes a close wait until the file's data is on the disks
	// of every live replica (fdatasync), as an fsync does. Without it a
	// close waits until every live replica has the data in its memory:
	// it survives the crash of any process and, with replicas 2 or more,
	// the loss of any one machine, and an fsync makes it durable on disk
	// (README.md "The durability contract").
	CloseSync bool
	// Testing holds settings for tests only; no flag sets them.
	Testing Testing
}

// Testing are Config settings that hold the client's internal mechanisms
// in a state a test needs.
type Testing struct {
	// NoDelegations turns create delegations off: every create is a call
	// to the meta service (see README.md "Create delegations").
	NoDelegations bool
	// CreateSendDelay is the longest a file made under a delegation waits
	// to be sent when nobody waits for it (0: pendingDelay, 2 ms).
	CreateSendDelay time.Duration
}

// Client is a connection to one weft cluster: a session with the meta
// service and connections to the data servers. It is safe for concurrent
// use.
type Client struct {
	cfg  Config
	log  *slog.Logger
	conn *metaConn
	meta weftv1.MetaClient

	// localSetAttrs counts attribute changes applied to unsent creates
	// (setAttrLocal).
	localSetAttrs atomic.Uint64
	// layoutHints are regular files' layouts heard lately; earlyOpens
	// counts chunks opened beside their file's open (earlyopen.go).
	layoutHints layoutHints
	earlyOpens  atomic.Uint64

	sessionMu sync.Mutex
	session   string
	lease     time.Duration
	epoch     string    // the meta service's incarnation, "" if it needs no replay (replay.go)
	opens     openTable // files open with the meta service (replay.go)

	chains chainTable
	// localBytes counts bytes read in place, localOpen the chunks open
	// for it (localread.go).
	localBytes atomic.Uint64
	localOpen  atomic.Int64
	attempts   attemptWatch // requests waiting for data servers

	inodesMu sync.Mutex
	inodes   map[uint64]*inode
	// closedUnsynced remembers the chains of closed files with chunks
	// written without sync (unsynced.go).
	closedUnsynced closedFiles
	// lostHook is told of files whose write-back failed (OnLostWrites).
	lostHook atomic.Pointer[func(ino uint64)]

	// buffered counts bytes in write buffers and in flight to data
	// servers, over all inodes.
	buffered atomic.Int64
	// raHeld counts bytes of read-ahead windows fetched or being fetched
	// and not given back, over all inodes; raBudget bounds it (see
	// readahead.go), raPeak is its largest value.
	raHeld, raPeak atomic.Int64
	raBudget       int64

	groups groupCache

	cb    callbackState // callbacks from the meta service (callbacks.go)
	dirs  dirCache      // directories known completely (dircache.go)
	deleg delegState    // create delegations (delegate.go)
	rel   releaser      // releases sent in the background (release.go)

	bg        context.Context // background sends and session renewal
	cancelBg  context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New dials the meta service, opens a session (renewed in the background
// at a third of its lease) and fetches the chain table.
func New(ctx context.Context, cfg Config) (*Client, error) {
	rpc.TuneGC(200)
	addrs := append(strings.Split(cfg.MetaAddr, ","), cfg.MetaAddrs...)
	if cfg.MetaAddr == "" && len(cfg.MetaAddrs) == 0 {
		return nil, errors.New("client: no meta service address given")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Version == "" {
		cfg.Version = defaultVersion
	}
	if cfg.WriteBufferBytes <= 0 {
		cfg.WriteBufferBytes = DefaultWriteBufferBytes
	}
	if cfg.ReadAheadBytes == 0 {
		cfg.ReadAheadBytes = DefaultReadAheadBytes
	}
	if cfg.UnavailableTimeout <= 0 {
		cfg.UnavailableTimeout = DefaultUnavailableTimeout
	}
	switch cfg.OnUnavailable {
	case "":
		cfg.OnUnavailable = DefaultOnUnavailable
	case OnUnavailableWait, OnUnavailableFail:
	default:
		return nil, fmt.Errorf("client: on-unavailable %q: want %q or %q", cfg.OnUnavailable, OnUnavailableWait, OnUnavailableFail)
	}
	conn, err := newMetaConn(addrs, cfg.UnavailableTimeout, cfg.Logger)
	if err != nil {
		return nil, err
	}
	cfg.MetaAddr = strings.Join(conn.addresses(), ",")
	c := &Client{
		cfg:      cfg,
		raBudget: raBudgetWindows * max(cfg.ReadAheadBytes, 0),
		log:      cfg.Logger,
		conn:     conn,
		meta:     weftv1.NewMetaClient(conn),
		inodes:   make(map[uint64]*inode),
		groups:   groupCache{entries: make(map[uint32]groupEntry)},
	}
	conn.before = c.beforeCall
	conn.after = c.afterCall
	c.dirs.release = c.queueForget
	c.deleg.slots = make(chan struct{}, maxCreateManyInFlight)
	c.chains.init(c)
	if err := c.openSession(ctx, false); err != nil {
		conn.close()
		return nil, err
	}
	if err := c.chains.refresh(ctx); err != nil {
		c.closeSession(ctx)
		conn.close()
		return nil, err
	}
	c.bg, c.cancelBg = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.renewLoop()
	c.WatchCallbacks(cfg.OnInvalidate)
	return c, nil
}

// Meta returns the meta service client of this connection, for admin
// operations the Client has no method for (Status, layouts). Its calls
// wait while the meta service is unreachable, up to the context's deadline
// or, without one, Config.UnavailableTimeout.
func (c *Client) Meta() weftv1.MetaClient { return c.meta }

// MetaAddresses lists the meta servers the client knows: those
// configured and those the meta service listed.
func (c *Client) MetaAddresses() []string { return c.conn.addresses() }

// Session returns the id of the client's current session.
func (c *Client) Session() string {
	c.sessionMu.Lock()
	defer c.sessionMu.Unlock()
	return c.session
}

// openSession opens a session with the meta service. With replay, the
// files the client has open are recorded as open in it when the meta
// service replays opens (replay.go), and released in it from then on.
func (c *Client) openSession(ctx context.Context, replay bool) error {
	host, _ := os.Hostname()
	ctx, cancel := context.WithTimeout(ctx, min(sessionCallTimeout, c.cfg.UnavailableTimeout))
	defer cancel()
	req := &weftv1.OpenSessionRequest{Host: host, MountPoint: c.cfg.MountPoint, Version: c.cfg.Version}
	c.sessionMu.Lock()
	old, replay := c.session, replay && c.epoch != ""
	c.sessionMu.Unlock()
	if replay {
		c.opens.replayMu.Lock()
		defer c.opens.replayMu.Unlock()
		req.Reopen = c.opens.snapshot(nil) // queued releases go to the old session
	}
	resp, err := c.meta.OpenSession(ctx, req)
	if err != nil {
		return fmt.Errorf("open a session with the meta service at %s (is `weft meta` running and reachable?): %w",
			c.cfg.MetaAddr, err)
	}
	lease := time.Duration(resp.LeaseMs) * time.Millisecond
	if lease <= 0 {
		lease = 30 * time.Second
	}
	if replay {
		c.opens.noteMoved(old, resp.Session)
	}
	c.sessionMu.Lock()
	c.session, c.lease, c.epoch = resp.Session, lease, resp.Epoch
	c.conn.learn(resp.MetaAddresses)
	c.sessionMu.Unlock()
	c.conn.learnWire(resp.WireAddress)
	return nil
}

// renewLoop renews the session at a third of its lease until Close. A
// session the meta service no longer knows (expired while it was
// unreachable) is replaced by a new one.
func (c *Client) renewLoop() {
	defer c.wg.Done()
	for {
		c.sessionMu.Lock()
		every := c.lease / 3
		sess, epoch := c.session, c.epoch
		c.sessionMu.Unlock()
		select {
		case <-c.bg.Done():
			return
		case <-time.After(every):
		}
		ctx, cancel := context.WithTimeout(c.bg, every)
		resp, err := c.meta.RenewSession(ctx, &weftv1.RenewSessionRequest{Session: sess})
		cancel()
		c.conn.learn(resp.GetMetaAddresses())
		if err == nil {
			c.conn.learnWire(resp.WireAddress)
			if resp.Epoch != epoch {
				c.noteEpoch(sess, epoch, resp.Epoch, every)
			}
		}
		if err == nil || c.bg.Err() != nil {
			continue
		}
		c.log.Warn("renewing the session with the meta service failed; opening a new one",
			"meta", c.cfg.MetaAddr, "session", sess, "err", err)
		if err := c.openSession(c.bg, true); err != nil && c.bg.Err() == nil {
			c.log.Error("cannot open a new session with the meta service; will retry",
				"meta", c.cfg.MetaAddr, "err", err)
		}
	}
}

func (c *Client) closeSession(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sessionCallTimeout)
	defer cancel()
	_, err := c.meta.CloseSession(ctx, &weftv1.CloseSessionRequest{Session: c.Session()})
	if err != nil {
		return fmt.Errorf("close session with the meta service at %s: %w", c.cfg.MetaAddr, err)
	}
	return nil
}

// Close flushes every buffered write (durably, committing file sizes),
// closes the session and the connections. Calling it again returns the
// first call's result.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		ctx := context.Background()
		err := c.FlushAll(ctx)
		c.drainReleases()
		c.cancelBg()
		c.wg.Wait()
		err = errors.Join(err, c.closeSession(ctx))
		c.chains.close()
		err = errors.Join(err, c.conn.close())
		c.closeErr = err
	})
	return c.closeErr
}

// FlushAll flushes every inode's buffered writes durably and commits their
// sizes. It returns the first error (each inode's error is reported once).
func (c *Client) FlushAll(ctx context.Context) error {
	c.sendPending(ctx) // files made under delegations first
	c.inodesMu.Lock()
	all := make([]*inode, 0, len(c.inodes))
	for _, in := range c.inodes {
		all = append(all, in)
	}
	c.inodesMu.Unlock()
	var errs []error
	for _, in := range all {
		if err := in.flush(ctx, true, nil, false); err != nil {
			errs = append(errs, err)
		}
		in.mu.Lock()
		closed := in.opens <= 0
		in.mu.Unlock()
		if closed {
			in.settleLost(ctx) // its last close could not cut it
		}
	}
	return errors.Join(errs...)
}

// Caller builds the identity of a calling process for the meta service's
// permission checks: uid and gid as given, supplementary groups read from
// /proc/<pid>/status (cached briefly per pid), and the client's session
// (which the meta service registers locks and callbacks against).
func (c *Client) Caller(uid, gid, pid uint32) *weftv1.Caller {
	return &weftv1.Caller{Uid: uid, Gid: gid, Pid: pid, Groups: c.groups.get(pid), Session: c.Session()}
}
