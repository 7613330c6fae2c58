package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// DefaultConns is the number of connections a Client opens to its server:
// requests are spread over them, so one large write does not hold up the
// requests behind it, and two readers receive in parallel.
const DefaultConns = 2

// dialTimeout bounds connecting (and the preface exchange).
const dialTimeout = 2 * time.Second

// Client sends requests to one data server over a few connections, each
// carrying many requests at once. Connections are made on first use and
// again after one breaks. Its methods may be called concurrently.
type Client struct {
	peer      string // what the server is, for messages: "data server", "meta server"
	addr      string
	a         Addr
	next      atomic.Uint32
	calls     atomic.Uint64
	unixOff   atomic.Bool // the Unix socket is not this server's
	unixConns atomic.Uint64
	// openRounds counts rounds of chunk opens in place (OpenChunk,
	// OpenChunks).
	openRounds atomic.Uint64
	localFields

	mu     sync.Mutex
	slots  []*clientConn // nil: not connected
	dialMu []sync.Mutex  // one dial per slot at a time
	closed bool
}

// NewClient returns a client of the data server whose lean data path
// listens on addr (the text form of an Addr), with conns connections
// (DefaultConns if <= 0). Nothing is dialed until the first request.
func NewClient(addr string, conns int) *Client {
	if conns <= 0 {
		conns = DefaultConns
	}
	return &Client{peer: "data server", addr: addr, a: ParseAddr(addr), slots: make([]*clientConn, conns), dialMu: make([]sync.Mutex, conns)}
}

// NewMetaClient returns a client of the meta server whose lean path
// listens on addr (the text form of an Addr): batches of namespace calls
// (Batch), over one connection.
func NewMetaClient(addr string) *Client {
	c := NewClient(addr, 1)
	c.peer = "meta server"
	return c
}

// Addr is the server address as given to NewClient.
func (c *Client) Addr() string { return c.addr }

// OpenRounds is the number of rounds of requests that opened chunks in
// place (OpenChunk and OpenChunks calls that reached the server).
func (c *Client) OpenRounds() uint64 { return c.openRounds.Load() }

// Connected reports whether the client holds a connection that has not
// broken: false before the first request, and after the server went away
// (its connections broke), until one is dialed again.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.slots {
		if cc != nil && !cc.broken() {
			return true
		}
	}
	return false
}

// Calls is the number of requests sent so far.
func (c *Client) Calls() uint64 { return c.calls.Load() }

// Close closes every connection; requests in flight fail with
// Unavailable.
func (c *Client) Close() error {
	c.closeLocal()
	c.mu.Lock()
	c.closed = true
	slots := append([]*clientConn(nil), c.slots...)
	c.mu.Unlock()
	for _, cc := range slots {
		if cc != nil {
			cc.fail(errors.New("client closed"))
		}
	}
	return nil
}

// conn returns a live connection, dialing one if its slot has none.
func (c *Client) conn(ctx context.Context) (*clientConn, error) {
	i := int(c.next.Add(1)) % len(c.slots)
	c.mu.Lock()
	cc, closed := c.slots[i], c.closed
	c.mu.Unlock()
	if closed {
		return nil, status.Errorf(codes.Unavailable, "lean path to %s %s: client closed", c.peer, c.a.TCP)
	}
	if cc != nil && !cc.broken() {
		return cc, nil
	}
	c.dialMu[i].Lock()
	defer c.dialMu[i].Unlock()
	c.mu.Lock()
	cc = c.slots[i]
	c.mu.Unlock()
	if cc != nil && !cc.broken() {
		return cc, nil
	}
	cc, err := c.dialAddr(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cc.fail(errors.New("client closed"))
		return nil, status.Errorf(codes.Unavailable, "lean path to %s %s: client closed", c.peer, c.a.TCP)
	}
	c.slots[i] = cc
	c.mu.Unlock()
	return cc, nil
}

// clientConn is one connection and the requests waiting on it.
type clientConn struct {
	peer string
	addr string
	nc   net.Conn
	br   *bufio.Reader

	wmu sync.Mutex // one frame at a time

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*call
	err     error // set once the connection broke
	dead    atomic.Bool
}

// call is one request waiting for its answer.
type call struct {
	done chan struct{}
	dst  []byte // ReadChunk: receive the payload here if it fits
	// The answer.
	code, errno, flags uint32
	msg                string
	data               []byte
	aux                uint32 // header field of the answer
	err                error  // connection failure
}

func dial(ctx context.Context, peer, addr string) (*clientConn, error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "connect to %s %s (lean path): %v", peer, addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetReadBuffer(4 << 20)
		tc.SetWriteBuffer(4 << 20)
	}
	if dl, ok := dctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	var pre [8]byte
	if _, err = nc.Write(preface[:]); err == nil {
		_, err = io.ReadFull(nc, pre[:])
	}
	if err == nil && pre != preface {
		err = errors.New("the server did not answer with the weft preface")
	}
	if err != nil {
		nc.Close()
		return nil, status.Errorf(codes.Unavailable, "connect to %s %s (lean path): %v", peer, addr, err)
	}
	nc.SetDeadline(time.Time{})
	return newClientConn(peer, addr, nc), nil
}

// newClientConn starts receiving answers on nc, connected and past the
// preface.
func newClientConn(peer, addr string, nc net.Conn) *clientConn {
	cc := &clientConn{peer: peer, addr: addr, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), pending: make(map[uint64]*call)}
	go cc.readLoop()
	return cc
}

func (cc *clientConn) broken() bool { return cc.dead.Load() }

// fail breaks the connection: every request waiting on it fails with
// Unavailable.
func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return
	}
	cc.err = err
	cc.dead.Store(true)
	pending := cc.pending
	cc.pending = nil
	cc.mu.Unlock()
	cc.nc.Close()
	for _, cl := range pending {
		cl.err = cc.connError(err)
		close(cl.done)
	}
}

func (cc *clientConn) connError(err error) error {
	return status.Errorf(codes.Unavailable, "connection to %s %s (lean path) broke: %v", cc.peer, cc.addr, err)
}

// readLoop receives answers until the connection breaks.
func (cc *clientConn) readLoop() {
	var hb [headerLen]byte
	var mb [256]byte
	for {
		if err := readFull(cc.br, hb[:]); err != nil {
			cc.fail(err)
			return
		}
		h, err := parseHeader(hb[:])
		if err == nil && (h.op != opResponse || h.metaLen < respMetaMin || h.metaLen > maxMeta) {
			err = fmt.Errorf("%w: unexpected frame op %d with %d bytes of fields", errProtocol, h.op, h.metaLen)
		}
		if err != nil {
			cc.fail(err)
			return
		}
		meta := mb[:0]
		if h.metaLen <= len(mb) {
			meta = mb[:h.metaLen]
		} else {
			meta = make([]byte, h.metaLen)
		}
		if err := readFull(cc.br, meta); err != nil {
			cc.fail(err)
			return
		}
		cc.mu.Lock()
		cl := cc.pending[h.id]
		delete(cc.pending, h.id)
		cc.mu.Unlock()
		var data []byte
		if cl == nil && h.payloadLen > 0 {
			// Given up by its caller: skip the payload.
			if _, err := cc.br.Discard(h.payloadLen); err != nil {
				cc.fail(err)
				return
			}
			continue
		}
		if h.payloadLen > 0 {
			if h.payloadLen <= len(cl.dst) {
				data = cl.dst[:h.payloadLen]
			} else {
				data = make([]byte, h.payloadLen)
			}
			if err := readFull(cc.br, data); err != nil {
				cl.err = cc.connError(err)
				close(cl.done)
				cc.fail(err)
				return
			}
		}
		if cl == nil {
			continue // given up by its caller
		}
		cl.code, cl.errno, cl.flags, cl.aux = le.Uint32(meta[0:]), le.Uint32(meta[4:]), le.Uint32(meta[8:]), h.aux
		if cl.code != 0 {
			cl.msg = string(meta[respMetaMin:])
		}
		cl.data = data
		close(cl.done)
	}
}

// longAgo makes a pending write fail at once.
var longAgo = time.Unix(1, 0)

// do sends a request (fields in meta, payload) and waits for its answer.
// The payload is no longer referenced when do returns.
func (c *Client) do(ctx context.Context, op uint8, meta []byte, payload []byte, dst []byte) (*call, error) {
	cc, err := c.pick(ctx)
	if err != nil {
		return nil, err
	}
	return c.doOn(ctx, cc, op, meta, payload, dst)
}

// pick returns the connection for the next request.
func (c *Client) pick(ctx context.Context) (*clientConn, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	cc, err := c.conn(ctx)
	if err != nil {
		return nil, notSent{err}
	}
	return cc, nil
}

// ErrNotSent marks the errors of requests that never left the client (no
// connection could be made, or it had broken before): they may be sent
// again, elsewhere, without being applied twice.
var ErrNotSent = errors.New("request not sent")

// notSent is an error of a request that was not sent; it keeps the
// error's gRPC status.
type notSent struct{ err error }

func (e notSent) Error() string              { return e.err.Error() }
func (e notSent) Unwrap() error              { return e.err }
func (e notSent) Is(target error) bool       { return target == ErrNotSent }
func (e notSent) GRPCStatus() *status.Status { return status.Convert(e.err) }

// doOn is do on connection cc.
func (c *Client) doOn(ctx context.Context, cc *clientConn, op uint8, meta []byte, payload []byte, dst []byte) (*call, error) {
	c.calls.Add(1)
	cl := &call{done: make(chan struct{}), dst: dst}
	cc.mu.Lock()
	if cc.err != nil {
		err := cc.connError(cc.err)
		cc.mu.Unlock()
		return nil, notSent{err}
	}
	cc.nextID++
	id := cc.nextID
	cc.pending[id] = cl
	cc.mu.Unlock()

	var timeout uint32
	if dl, ok := ctx.Deadline(); ok {
		timeout = uint32(max(time.Until(dl).Milliseconds(), 1))
	}
	var hb [headerLen + maxFixedMeta]byte
	header{op: op, metaLen: len(meta), payloadLen: len(payload), id: id, timeoutMs: timeout}.put(hb[:])
	n := copy(hb[headerLen:], meta)
	if err := cc.send(ctx, hb[:headerLen+n], payload); err != nil {
		cc.fail(err)
		<-cl.done
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, cl.err
	}
	select {
	case <-cl.done:
	case <-ctx.Done():
		cc.mu.Lock()
		_, waiting := cc.pending[id]
		if waiting {
			delete(cc.pending, id)
		}
		cc.mu.Unlock()
		if !waiting {
			// The answer is being received (perhaps into dst): wait for it.
			<-cl.done
			break
		}
		go cc.cancel(id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if cl.err != nil {
		return nil, cl.err
	}
	return cl, nil
}

// send writes one frame; a context that ends meanwhile aborts the write
// (the connection then breaks: a frame was cut).
func (cc *clientConn) send(ctx context.Context, head, payload []byte) error {
	cc.wmu.Lock()
	defer cc.wmu.Unlock()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { cc.nc.SetWriteDeadline(longAgo) })
		defer func() {
			if !stop() {
				cc.nc.SetWriteDeadline(time.Time{})
			}
		}()
	}
	return writeFrame(cc.nc, head, payload)
}

// cancel tells the server to give up on request id.
func (cc *clientConn) cancel(id uint64) {
	var hb [headerLen]byte
	header{op: opCancel, id: id}.put(hb[:])
	cc.wmu.Lock()
	defer cc.wmu.Unlock()
	if cc.broken() {
		return
	}
	cc.nc.SetWriteDeadline(time.Now().Add(dialTimeout))
	if _, err := cc.nc.Write(hb[:]); err != nil {
		go cc.fail(err)
	}
	cc.nc.SetWriteDeadline(time.Time{})
}

// callError turns an error answer into what the gRPC client returns for
// it (with package fserr's interceptor): a status, or an error wrapping
// the errno.
func (cl *call) callError() error {
	if cl.code == 0 {
		return nil
	}
	st := status.New(codes.Code(cl.code), cl.msg)
	if cl.errno != 0 {
		if d, err := st.WithDetails(&weftv1.Errno{Errno: cl.errno}); err == nil {
			st = d
		}
	}
	return fserr.FromStatus(st.Err())
}

// WriteChunk sends a chunk write. A write of pieces (req.PieceOffsets
// and req.PieceLengths, their bytes one after another in req.Data) goes
// as WritePieces sends it.
func (c *Client) WriteChunk(ctx context.Context, req *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	data := req.GetData()
	if len(req.GetPieceOffsets()) > 0 {
		return c.WritePieces(ctx, req, [][]byte{data})
	}
	return c.writeInFrame(ctx, req, data)
}

// WritePieces sends a write of pieces (req.PieceOffsets and
// req.PieceLengths) whose bytes are pieces, one after another, instead of
// req.Data: they are copied once, behind the table, into a pooled buffer
// that is the frame's payload.
func (c *Client) WritePieces(ctx context.Context, req *weftv1.WriteChunkRequest, pieces [][]byte) (*weftv1.WriteChunkResponse, error) {
	offs, lens := req.GetPieceOffsets(), req.GetPieceLengths()
	if len(offs) != len(lens) || len(offs) > MaxPayload/12 {
		return nil, notSent{status.Errorf(codes.InvalidArgument, "write of pieces of chunk %d of file %d: %d offsets, %d lengths",
			req.GetChunk().GetIndex(), req.GetChunk().GetIno(), len(offs), len(lens))}
	}
	n := piecesTableLen(len(offs))
	for _, p := range pieces {
		n += len(p)
	}
	data := GetBuffer(n)
	defer PutBuffer(data) // do no longer references the payload once it returns
	putPieces(data, offs, lens, pieces)
	return c.writeInFrame(ctx, req, data)
}

// writeInFrame sends a write whose bytes, data, follow its fields in the
// frame.
func (c *Client) writeInFrame(ctx context.Context, req *weftv1.WriteChunkRequest, data []byte) (*weftv1.WriteChunkResponse, error) {
	var m [writeMetaLen]byte
	putWrite(m[:], req)
	return writeResponse(c.do(ctx, opWriteChunk, m[:], data, nil))
}

// writeResponse is the answer to a write call.
func writeResponse(cl *call, err error) (*weftv1.WriteChunkResponse, error) {
	if err != nil {
		return nil, err
	}
	if err := cl.callError(); err != nil {
		return nil, err
	}
	return &weftv1.WriteChunkResponse{NeedFullChunk: cl.flags&flagNeedFull != 0}, nil
}

// ReadChunk reads from a chunk into a new buffer.
func (c *Client) ReadChunk(ctx context.Context, req *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
	data, err := c.ReadChunkInto(ctx, req, nil)
	if err != nil {
		return nil, err
	}
	return &weftv1.ReadChunkResponse{Data: data}, nil
}

// ReadChunkInto reads from a chunk into dst when the answer fits (else
// into a new buffer) and returns what the server sent: shorter than asked
// where the chunk ends.
func (c *Client) ReadChunkInto(ctx context.Context, req *weftv1.ReadChunkRequest, dst []byte) ([]byte, error) {
	var m [readMetaLen]byte
	putRead(m[:], req)
	cl, err := c.do(ctx, opReadChunk, m[:], nil, dst)
	if err != nil {
		return nil, err
	}
	if err := cl.callError(); err != nil {
		return nil, err
	}
	return cl.data, nil
}

// SyncFile makes a file's chunks of a chain durable.
func (c *Client) SyncFile(ctx context.Context, req *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
	var m [syncMetaLen]byte
	putSync(m[:], req)
	cl, err := c.do(ctx, opSyncFile, m[:], nil, nil)
	if err != nil {
		return nil, err
	}
	if err := cl.callError(); err != nil {
		return nil, err
	}
	return &weftv1.SyncFileResponse{}, nil
}

// Batch sends a batch of namespace calls to a meta server (see
// NewMetaClient) and returns its answers. An error that wraps ErrNotSent
// means the batch never reached the server.
func (c *Client) Batch(ctx context.Context, req *weftv1.BatchRequest) (*weftv1.BatchResponse, error) {
	body, err := proto.Marshal(req)
	if err != nil {
		return nil, notSent{status.Errorf(codes.Internal, "lean path: encode a batch of meta calls: %v", err)}
	}
	cl, err := c.do(ctx, opMetaBatch, nil, body, nil)
	if err != nil {
		return nil, err
	}
	if err := cl.callError(); err != nil {
		return nil, err
	}
	resp := new(weftv1.BatchResponse)
	if err := proto.Unmarshal(cl.data, resp); err != nil {
		return nil, status.Errorf(codes.Internal, "lean path: decode the answers of a batch of meta calls from %s: %v", c.a.TCP, err)
	}
	return resp, nil
}
