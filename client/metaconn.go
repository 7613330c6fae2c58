package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
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
	// mdRequestID carries the id of a namespace operation that changes
	// something (see meta/ha_requests.go); alreadyApplied is the message
	// of the answer to one applied before.
	mdRequestID    = "weft-request-id"
	alreadyApplied = "weft: request already applied"
	metaMethod     = "/weft.v1.Meta/"
)

// mutating lists the Meta methods that change the namespace in one
// transaction: with several meta servers they carry a request id, so that
// one cut off in flight is retried on another meta server and still
// applied once.
var mutating = map[string]bool{
	"Create": true, "Mkdir": true, "Unlink": true, "Rmdir": true, "Rename": true, "Link": true,
	"Symlink": true, "SetAttr": true, "Open": true, "Release": true, "CommitWrite": true,
	"SetXattr": true, "RemoveXattr": true, "SetLayout": true,
}

// idempotent lists the Meta methods that may simply be sent again after
// being cut off in flight.
var idempotent = map[string]bool{
	"Lookup": true, "GetAttr": true, "Readlink": true, "ReadDir": true, "Access": true, "StatFS": true,
	"GetXattr": true, "ListXattr": true, "GetLayout": true, "GetChains": true, "Status": true,
	"OpenSession": true, "RenewSession": true, "CloseSession": true, "GetLock": true,
	// The mutating calls of a batch carry their own request ids.
	"Batch": true,
	// Taking or releasing the same lock again for the same owner leaves
	// the same locks: a lock request may be resent too.
	"SetLock": true,
}

// metaConn is the connection to the meta service as the Client uses it,
// and the one place that knows there may be several meta servers.
//
// With one address a call waits while the service is unreachable (a
// restarting `weft meta`) instead of failing at once, up to the caller's
// deadline or, without one, wait; one cut off in flight fails, so no
// namespace operation is applied twice.
//
// With several addresses (configured, and learned from the session
// answers) a call goes to the meta server in use; one that is not
// connected within connectWait is left for the next. A call cut off in
// flight is sent again to the next meta server if it is idempotent or
// carries a request id (namespace operations that change something): the
// meta service applies a request id once and answers a repeat with
// "already applied", upon which the result is read back (a lookup of the
// new name, the inode's attributes). Other calls cut off in flight fail.
// The session lives in the metadata store, so it is valid on every meta
// server.
type metaConn struct {
	wait time.Duration
	log  *slog.Logger

	mu    sync.Mutex
	addrs []string
	conns map[string]*grpc.ClientConn
	cur   int // index in addrs of the meta server in use

	batch batcher // concurrent namespace calls go together (batch.go)

	// before runs ahead of every call (the client's delegations,
	// delegate.go); nil: nothing.
	before func(ctx context.Context, method string) error
	// after, if set, runs when a call returned (whatever its outcome).
	after func(ctx context.Context, method string)
}

func newMetaConn(addrs []string, wait time.Duration, log *slog.Logger) (*metaConn, error) {
	m := &metaConn{wait: wait, log: log, conns: make(map[string]*grpc.ClientConn)}
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

// learnWire takes the lean path address a session answer named (""
// none): namespace calls go there from now on (batch.go). The lean path
// is not used when WEFT_META_WIRE=off is in the environment.
func (m *metaConn) learnWire(addr string) {
	if addr == "" || leanMetaOff {
		if old := m.batch.lean.Swap(nil); old != nil {
			old.Close()
		}
		return
	}
	if old := m.batch.lean.Load(); old != nil && old.Addr() == addr {
		return
	}
	if old := m.batch.lean.Swap(wire.NewMetaClient(addr)); old != nil {
		// Batches may still be on their way over it.
		time.AfterFunc(leanRetire, func() { old.Close() })
	}
}

// leanRetire is how long a lean path client replaced by another stays
// open for the batches sent over it.
const leanRetire = time.Minute

// leanMetaOff is WEFT_META_WIRE=off: namespace calls over gRPC only.
var leanMetaOff = os.Getenv("WEFT_META_WIRE") == "off"

// addresses lists the known meta servers.
func (m *metaConn) addresses() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.addrs)
}

func (m *metaConn) close() error {
	if w := m.batch.lean.Swap(nil); w != nil {
		w.Close()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
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

// Invoke implements grpc.ClientConnInterface. Namespace calls made while
// another is in flight go together in a batch (batch.go).
func (m *metaConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if m.before != nil {
		if err := m.before(ctx, method); err != nil {
			return err
		}
	}
	if m.after != nil {
		defer m.after(ctx, method)
	}
	if name, ok := strings.CutPrefix(method, metaMethod); ok && batchMethods[name] && !m.batch.off.Load() {
		a, aok := args.(proto.Message)
		r, rok := reply.(proto.Message)
		if aok && rok {
			return m.batch.invoke(ctx, method, name, a, r)
		}
	}
	return m.invokeAlone(ctx, method, args, reply, opts...)
}

// invokeAlone sends one call (or one batch) to the meta service, failing
// over between meta servers.
func (m *metaConn) invokeAlone(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.wait)
		defer cancel()
	}
	addr, cc, n := m.current()
	if n == 1 {
		return cc.Invoke(ctx, method, args, reply, append(opts, grpc.WaitForReady(true))...)
	}
	name := strings.TrimPrefix(method, metaMethod)
	retry := idempotent[name]
	sent := false // a try of this call may have reached a meta server
	if mutating[name] {
		retry = true
		id, tried := ctx.Value(requestIDKey{}).(string)
		if !tried {
			id = newRequestID()
		}
		// A call tried before (on the lean path) keeps its id, so the meta
		// service applies it once, and may have been applied.
		sent = tried
		ctx = metadata.AppendToOutgoingContext(ctx, mdRequestID, id)
	}
	tried := 0
	for {
		if ready(ctx, cc) {
			err := cc.Invoke(ctx, method, args, reply, opts...)
			switch {
			case err == nil:
				return nil
			case sent && status.Code(err) == codes.Aborted && strings.Contains(err.Error(), alreadyApplied):
				return m.readBack(ctx, name, args, reply)
			case status.Code(err) != codes.Unavailable || !retry || ctx.Err() != nil:
				return err
			}
			sent = true
		} else if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		m.next(addr)
		if tried++; tried%n == 0 {
			select {
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			case <-time.After(roundPause):
			}
		}
		addr, cc, n = m.current()
	}
}

// readBack fills reply for a request the meta service had applied before
// it was cut off: with what the namespace holds now.
func (m *metaConn) readBack(ctx context.Context, name string, args, reply any) error {
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

// requestIDKey carries the request id a call was sent with before (on the
// lean path), for a try over gRPC.
type requestIDKey struct{}

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
