package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Fail-over between meta servers.
const (
	// connectWait is how long a call waits for a meta server it is not
	// connected to before it tries the next one.
	connectWait = time.Second
	// roundPause is the pause after every known meta server failed once.
	roundPause = 200 * time.Millisecond
	// alreadyApplied is the message of the answer to a request applied
	// before (see meta/ha_requests.go).
	alreadyApplied = "weft: request already applied"
)

// metaConn is the connection to the meta service as the Client uses it,
// and the one place that knows there may be several meta servers.
//
// Namespace calls (methods whose call option says batch, see
// weftv1.MetaCallOf) go over the meta server's lean path, in batches
// (batch.go); the lean path shares the meta server's port with gRPC, so a
// meta server's address names both. Session, lock, cluster and callback
// calls go over gRPC.
//
// With one address a call waits while the service is unreachable (a
// restarting `weft meta`) instead of failing at once, up to the caller's
// deadline or, without one, wait; one cut off in flight fails, so no
// namespace operation is applied twice.
//
// With several addresses (configured, and learned from the session
// answers) a call goes to the meta server in use; one that cannot be
// reached is left for the next. A call cut off in flight is sent again to
// the next meta server as its method's retry says: calls that change
// nothing simply, namespace operations that change something with their
// request id, which the meta service applies once and answers a repeat of
// with "already applied", upon which the result is read back (a lookup of
// the new name, the inode's attributes). Other calls cut off in flight
// fail. The session lives in the metadata store, so it is valid on every
// meta server.
type metaConn struct {
	wait time.Duration
	log  *slog.Logger

	mu    sync.Mutex
	addrs []string
	conns map[string]*grpc.ClientConn
	wires map[string]*wire.Client // lean paths, by meta server address
	cur   int                     // index in addrs of the meta server in use

	batch batcher // concurrent namespace calls go together (batch.go)

	// before runs ahead of every call (the client's delegations,
	// delegate.go); nil: nothing.
	before func(ctx context.Context, method string) error
	// after, if set, runs when a call returned (whatever its outcome).
	after func(ctx context.Context, method string)
}

func newMetaConn(addrs []string, wait time.Duration, log *slog.Logger) (*metaConn, error) {
	m := &metaConn{wait: wait, log: log, conns: make(map[string]*grpc.ClientConn), wires: make(map[string]*wire.Client)}
	m.batch.m = m
	for _, a := range addrs {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(m.addrs, a) {
			m.addrs = append(m.addrs, a)
		}
	}
	if len(m.addrs) == 0 {
		return nil, fmt.Errorf("client: no meta service address given")
	}
	for _, a := range m.addrs {
		if _, err := m.conn(a); err != nil {
			m.close()
			return nil, err
		}
	}
	return m, nil
}

// conn returns the connection to addr, dialing it on first use. Called
// with or without m.mu held (dialing is lazy and does not block).
func (m *metaConn) conn(addr string) (*grpc.ClientConn, error) {
	if cc := m.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := rpc.Dial(addr)
	if err != nil {
		return nil, err
	}
	m.conns[addr] = cc
	return cc, nil
}

// current returns the meta server in use and how many are known.
func (m *metaConn) current() (string, *grpc.ClientConn, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.addrs[m.cur]
	cc, _ := m.conn(a)
	return a, cc, len(m.addrs)
}

// next moves away from addr (if it is still the one in use) and reports
// whether a whole round of meta servers has been tried.
func (m *metaConn) next(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.addrs[m.cur] != addr {
		return
	}
	m.cur = (m.cur + 1) % len(m.addrs)
	m.log.Warn("meta server unreachable; failing over", "from", addr, "to", m.addrs[m.cur])
}

// learn adds the meta servers a session answer listed.
func (m *metaConn) learn(addrs []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range addrs {
		if a != "" && !slices.Contains(m.addrs, a) {
			m.addrs = append(m.addrs, a)
			m.log.Info("meta server learned", "address", a)
		}
	}
}

// learnWire takes the lean path address a session answer named: its Unix
// socket (and the identity that socket must answer) is used for the meta
// server in use from now on; the TCP part is always the address the
// client dials.
func (m *metaConn) learnWire(text string) {
	a := wire.ParseAddr(text)
	if a.Unix == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	addr := m.addrs[m.cur]
	a.TCP = addr
	old := m.wires[addr]
	if old != nil && old.Addr() == a.String() {
		return
	}
	m.wires[addr] = wire.NewMetaClient(a.String())
	if old != nil {
		// Batches may still be on their way over it.
		time.AfterFunc(leanRetire, func() { old.Close() })
	}
}

// leanRetire is how long a lean path client replaced by another stays
// open for the batches sent over it.
const leanRetire = time.Minute

// currentWire returns the meta server in use, its lean path and how many
// meta servers are known.
func (m *metaConn) currentWire() (string, *wire.Client, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.addrs[m.cur]
	w := m.wires[a]
	if w == nil {
		w = wire.NewMetaClient(a)
		m.wires[a] = w
	}
	return a, w, len(m.addrs)
}

// addresses lists the known meta servers.
func (m *metaConn) addresses() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.addrs)
}

func (m *metaConn) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for a, w := range m.wires {
		w.Close()
		delete(m.wires, a)
	}
	var first error
	for a, cc := range m.conns {
		if err := cc.Close(); err != nil && first == nil {
			first = err
		}
		delete(m.conns, a)
	}
	return first
}

// ready waits up to connectWait for cc to be connected.
func ready(ctx context.Context, cc *grpc.ClientConn) bool {
	st := cc.GetState()
	if st == connectivity.Ready {
		return true
	}
	if st == connectivity.TransientFailure {
		cc.ResetConnectBackoff()
	}
	cc.Connect()
	ctx, cancel := context.WithTimeout(ctx, connectWait)
	defer cancel()
	for {
		st = cc.GetState()
		if st == connectivity.Ready {
			return true
		}
		if !cc.WaitForStateChange(ctx, st) {
			return false
		}
	}
}

// several reports whether more than one meta server is known.
func (m *metaConn) several() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.addrs) > 1
}

// Invoke implements grpc.ClientConnInterface: namespace calls go over
// the lean path, together in a batch with those made meanwhile
// (batch.go); other calls over gRPC.
func (m *metaConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if m.before != nil {
		if err := m.before(ctx, method); err != nil {
			return err
		}
	}
	if m.after != nil {
		defer m.after(ctx, method)
	}
	call := weftv1.MetaCallOf(method)
	if call.Batch {
		a, aok := args.(proto.Message)
		r, rok := reply.(proto.Message)
		if !aok || !rok {
			return status.Errorf(codes.Internal, "meta call %s: request or reply is not a protobuf message", method)
		}
		return m.batch.invoke(ctx, call, a, r)
	}
	return m.invokeGRPC(ctx, call, args, reply, opts...)
}

// invokeGRPC sends one call to the meta service over gRPC, failing over
// between meta servers.
func (m *metaConn) invokeGRPC(ctx context.Context, call *weftv1.MetaCall, args, reply any, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.wait)
		defer cancel()
	}
	addr, cc, n := m.current()
	if n == 1 {
		return cc.Invoke(ctx, call.FullName, args, reply, append(opts, grpc.WaitForReady(true))...)
	}
	tried := 0
	for {
		if ready(ctx, cc) {
			err := cc.Invoke(ctx, call.FullName, args, reply, opts...)
			if err == nil || status.Code(err) != codes.Unavailable || call.Retry != weftv1.Retry_RETRY_RESEND || ctx.Err() != nil {
				return err
			}
		} else if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		m.next(addr)
		if tried++; tried%n == 0 {
			if err := pause(ctx); err != nil {
				return err
			}
		}
		addr, cc, n = m.current()
	}
}

// roundTrip sends a batch to the meta server in use over its lean path.
// A batch that never left (the server cannot be reached) goes again, to
// the next meta server when there are several, after a pause once every
// one was tried, until ctx ends; one cut off in flight moves the client
// to the next meta server and returns the error: its calls are the
// caller's to send again or fail.
func (m *metaConn) roundTrip(ctx context.Context, req *weftv1.BatchRequest) (*weftv1.BatchResponse, error) {
	tried := 0
	for {
		addr, w, n := m.currentWire()
		resp, err := w.Batch(ctx, req)
		notSent := errors.Is(err, wire.ErrNotSent) && status.Code(err) == codes.Unavailable
		if err == nil || !notSent || ctx.Err() != nil {
			if status.Code(err) == codes.Unavailable && n > 1 {
				m.next(addr)
			}
			return resp, err
		}
		if n > 1 {
			m.next(addr)
		}
		if tried++; tried%n == 0 {
			if err := pause(ctx); err != nil {
				return nil, err
			}
		}
	}
}

// pause waits roundPause, or until ctx ends (its error).
func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-time.After(roundPause):
		return nil
	}
}

// readBack fills reply for a request the meta service had applied before
// it was cut off: with what the namespace holds now.
func (m *metaConn) readBack(ctx context.Context, args, reply any) error {
	mc := weftv1.NewMetaClient(m)
	lookup := func(c *weftv1.Caller, parent uint64, n string) (*weftv1.Attr, error) {
		r, err := mc.Lookup(ctx, &weftv1.LookupRequest{Caller: c, Parent: parent, Name: n})
		return r.GetAttr(), err
	}
	getAttr := func(ino uint64) (*weftv1.Attr, error) {
		r, err := mc.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: ino})
		return r.GetAttr(), err
	}
	var attr *weftv1.Attr
	var err error
	switch req := args.(type) {
	case *weftv1.CreateRequest:
		attr, err = lookup(req.Caller, req.Parent, req.Name)
		if r, ok := reply.(*weftv1.CreateResponse); ok && err == nil {
			r.Attr, r.Created = attr, true
		}
		return err
	case *weftv1.MkdirRequest:
		attr, err = lookup(req.Caller, req.Parent, req.Name)
	case *weftv1.SymlinkRequest:
		attr, err = lookup(req.Caller, req.Parent, req.Name)
	case *weftv1.LinkRequest:
		attr, err = lookup(req.Caller, req.NewParent, req.NewName)
	case *weftv1.SetAttrRequest:
		attr, err = getAttr(req.Ino)
	case *weftv1.OpenRequest:
		attr, err = getAttr(req.Ino)
	case *weftv1.CommitWriteRequest:
		attr, err = getAttr(req.Ino)
	case *weftv1.SetLayoutRequest:
		r, lerr := mc.GetLayout(ctx, &weftv1.GetLayoutRequest{Caller: req.Caller, Ino: req.Ino})
		if out, ok := reply.(*weftv1.SetLayoutResponse); ok && lerr == nil {
			out.Layout = r.GetLayout()
		}
		return lerr
	default:
		return nil // the answer is empty
	}
	if err != nil {
		return err
	}
	if r, ok := reply.(*weftv1.AttrResponse); ok {
		r.Attr = attr
	}
	return nil
}

// newRequestID makes a request id: the time first, so the meta service
// can drop old ids in order.
func newRequestID() string {
	var b [12]byte
	rand.Read(b[:])
	return fmt.Sprintf("%016x-%s", uint64(time.Now().UnixNano()), hex.EncodeToString(b[:]))
}

// NewStream implements grpc.ClientConnInterface: streams go to the meta
// server in use (the next one if it cannot be reached within
// connectWait); a stream cut off is the caller's to open again.
func (m *metaConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	addr, cc, n := m.current()
	if n == 1 {
		return cc.NewStream(ctx, desc, method, append(opts, grpc.WaitForReady(true))...)
	}
	for range n {
		if ready(ctx, cc) {
			break
		}
		m.next(addr)
		addr, cc, _ = m.current()
	}
	return cc.NewStream(ctx, desc, method, append(opts, grpc.WaitForReady(true))...)
}
