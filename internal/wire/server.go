package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Handler serves the requests of the lean data path: a data server's
// chunk I/O, which no other protocol carries.
type Handler interface {
	WriteChunk(ctx context.Context, req *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error)
	ReadChunk(ctx context.Context, req *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error)
	SyncFile(ctx context.Context, req *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error)
}

// PooledReader is implemented by a Handler that can read into a buffer
// of the pool (GetBuffer) instead of a new, zeroed one: the server gives
// buf back with PutBuffer once the answer is sent.
type PooledReader interface {
	ReadChunkPooled(ctx context.Context, req *weftv1.ReadChunkRequest) (data, buf []byte, err error)
}

// BatchHandler serves batches of meta service calls (opMetaBatch): the
// meta service's lean path, next to its gRPC Batch, which runs the same
// code.
type BatchHandler interface {
	Batch(ctx context.Context, req *weftv1.BatchRequest) (*weftv1.BatchResponse, error)
}

// QuickBatcher is implemented by batch handlers that can tell batches
// that answer at once (reads of the namespace from memory). Such a batch
// is served on the goroutine that reads the connection, which saves
// handing it to another goroutine (and waking another thread) for every
// call: a cold stat went 30% faster. A call served so that is about to
// wait (for another client, say) calls WillBlock first, and a new
// goroutine takes over reading the connection, so the requests behind it
// are not held up.
type QuickBatcher interface {
	QuickBatch(req *weftv1.BatchRequest) bool
}

// A connection whose last quick batch took longer than inlineSlow (its
// reads went to a disk, say) has its quick batches served on goroutines
// of their own again for inlineBackoff: one batch served inline holds up
// the ones behind it on the connection.
const (
	inlineSlow    = 500 * time.Microsecond
	inlineBackoff = 100 * time.Millisecond
)

// inlineKey is the context key of the hand-off of a call served inline.
type inlineKey struct{}

// WillBlock tells the lean path that the call of ctx is about to wait
// for something that may take long: if it is served on the goroutine
// reading its connection, another goroutine takes over the reading
// first. It does nothing for other calls.
func WillBlock(ctx context.Context) {
	if handOff, ok := ctx.Value(inlineKey{}).(func()); ok {
		handOff()
	}
}

// maxInFlight bounds the requests a connection runs at once; past it the
// server stops reading the connection (TCP pushes back on the client).
const maxInFlight = 64

// Server serves a Handler (a data server) or a BatchHandler (a meta
// server) over the wire protocol.
type Server struct {
	h   Handler      // nil on a meta server
	b   BatchHandler // nil on a data server
	log *slog.Logger

	mu     sync.Mutex
	lis    []net.Listener
	conns  map[*serverConn]struct{}
	closed bool
	wg     sync.WaitGroup // connections' goroutines and handlers
}

// NewServer returns a server of h; log receives connection errors.
func NewServer(h Handler, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{h: h, log: log, conns: make(map[*serverConn]struct{})}
}

// NewBatchServer returns a server of a meta service's batches; chunk
// requests get Unimplemented.
func NewBatchServer(b BatchHandler, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{b: b, log: log, conns: make(map[*serverConn]struct{})}
}

// Serve accepts connections on lis until Close; it returns nil after
// Close, else the accept error.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		lis.Close()
		return nil
	}
	s.lis = append(s.lis, lis)
	s.mu.Unlock()
	for {
		nc, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accept lean data path connections on %s: %w", lis.Addr(), err)
		}
		sc := &serverConn{s: s, nc: nc, cancels: make(map[uint64]context.CancelFunc), sem: make(chan struct{}, maxInFlight),
			done: make(chan struct{})}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		s.conns[sc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go sc.run()
	}
}

// Close stops accepting, lets requests under way finish for up to
// timeout, then closes every connection and waits for its goroutines.
func (s *Server) Close(timeout time.Duration) {
	s.mu.Lock()
	s.closed = true
	for _, l := range s.lis {
		l.Close()
	}
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for _, c := range conns {
		c.drain(deadline)
	}
	s.wg.Wait()
}

// serverConn is one client connection.
type serverConn struct {
	s  *Server
	nc net.Conn

	wmu sync.Mutex // one frame at a time

	mu      sync.Mutex
	cancels map[uint64]context.CancelFunc // requests under way
	sem     chan struct{}
	running sync.WaitGroup // requests being handled
	done    chan struct{}  // closed when the connection is finished

	// inlineOff: quick batches are not served inline before then (only
	// the goroutine reading the connection touches it).
	inlineOff time.Time
}

// drain waits until the connection's requests are done (or deadline),
// then closes it.
func (c *serverConn) drain(deadline time.Time) {
	// No new requests: reads fail from now on, and run waits for the
	// requests under way.
	c.nc.SetReadDeadline(time.Now())
	select {
	case <-c.done:
		return
	case <-time.After(time.Until(deadline)):
	}
	c.mu.Lock()
	for _, cancel := range c.cancels {
		cancel()
	}
	c.mu.Unlock()
	c.nc.Close()
	<-c.done
}

func (c *serverConn) run() {
	defer c.s.wg.Done()
	handedOff := false
	defer func() {
		if !handedOff {
			c.finish()
		}
	}()
	if uc, ok := c.nc.(*net.UnixConn); ok {
		// The default (about 200 KiB) makes a 1 MiB answer several
		// round trips through the scheduler.
		uc.SetWriteBuffer(unixBuffer)
	}
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var pre [8]byte
	if err := readFull(br, pre[:]); err != nil {
		return
	}
	switch pre {
	case preface:
		if _, err := c.nc.Write(preface[:]); err != nil {
			return
		}
	case prefaceID:
		if _, err := c.nc.Write(c.s.identityPreface()); err != nil {
			return
		}
	default:
		c.s.log.Warn("lean data path: a connection did not start with the weft preface; closing it", "remote", c.nc.RemoteAddr())
		return
	}
	handedOff = c.readLoop(br)
}

// finish ends the connection once nobody reads it any more: it waits for
// the requests under way and lets go of everything.
func (c *serverConn) finish() {
	c.running.Wait()
	c.nc.Close()
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	close(c.done)
}

// readLoop reads and serves requests until the connection fails (false)
// or another goroutine took over reading it (true; serveInline).
func (c *serverConn) readLoop(br *bufio.Reader) (handedOff bool) {
	var hb [headerLen]byte
	var meta [maxFixedMeta]byte
	for {
		if err := readFull(br, hb[:]); err != nil {
			c.readFailed(err)
			return false
		}
		h, err := parseHeader(hb[:])
		if err == nil && h.metaLen != metaLenOf(h.op) {
			err = fmt.Errorf("%w: op %d with %d bytes of fields", errProtocol, h.op, h.metaLen)
		}
		if err == nil && h.op != opWriteChunk && h.op != opMetaBatch && h.payloadLen != 0 {
			err = fmt.Errorf("%w: op %d with a payload", errProtocol, h.op)
		}
		if err != nil {
			c.s.log.Warn("lean data path: closing a connection", "remote", c.nc.RemoteAddr(), "err", err)
			return false
		}
		if err := readFull(br, meta[:h.metaLen]); err != nil {
			c.readFailed(err)
			return false
		}
		if h.op == opCancel {
			c.mu.Lock()
			if cancel := c.cancels[h.id]; cancel != nil {
				cancel()
			}
			c.mu.Unlock()
			continue
		}
		if (h.op == opMetaBatch) != (c.s.h == nil) {
			// A chunk request to a meta server, or a batch to a data
			// server: refused, the connection goes on.
			if err := skipPayload(br, h.payloadLen); err != nil {
				c.readFailed(err)
				return false
			}
			c.respond(h.id, status.Errorf(codes.Unimplemented, "lean path: this server does not serve op %d", h.op), 0, 0, nil)
			continue
		}
		if h.op == opLease {
			c.lease(h.id)
			continue
		}
		if h.op == opOpenChunk {
			// Served here, in turn, not on a goroutine of its own: a
			// client's opens on a connection (localConn) are one or a
			// round sent together that it waits for whole, so there is
			// nothing to overlap, and handing each open to another
			// goroutine woke another thread per chunk (a sequential
			// reader in place opens one chunk per MiB).
			c.openChunk(h.id, getRead(meta[:]), le.Uint32(meta[44:])&flagVerify != 0)
			continue
		}
		var payload []byte
		if h.payloadLen > 0 {
			payload = GetBuffer(h.payloadLen)
			if err := readFull(br, payload); err != nil {
				PutBuffer(payload)
				c.readFailed(err)
				return false
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		if h.timeoutMs > 0 {
			ctx, cancel = context.WithTimeout(context.Background(), time.Duration(h.timeoutMs)*time.Millisecond)
		}
		c.sem <- struct{}{}
		c.mu.Lock()
		c.cancels[h.id] = cancel
		c.mu.Unlock()
		c.running.Add(1)
		var req any
		switch h.op {
		case opWriteChunk:
			req = getWrite(meta[:], payload)
		case opReadChunk:
			req = getRead(meta[:])
		case opSyncFile:
			req = getSync(meta[:])
		case opMetaBatch:
			req = decodeBatch(payload)
		}
		if mb, ok := req.(*metaBatch); ok && c.s.quick(mb) && time.Now().After(c.inlineOff) {
			start := time.Now()
			if c.serveInline(br, func(handOff func()) {
				c.handle(context.WithValue(ctx, inlineKey{}, handOff), cancel, h, req, payload)
			}) {
				return true
			}
			if now := time.Now(); now.Sub(start) > inlineSlow {
				c.inlineOff = now.Add(inlineBackoff)
			}
			continue
		}
		go c.handle(ctx, cancel, h, req, payload)
	}
}

// quick reports whether mb is a batch the handler says answers at once
// (QuickBatcher).
func (s *Server) quick(mb *metaBatch) bool {
	q, ok := s.b.(QuickBatcher)
	return ok && mb.err == nil && q.QuickBatch(mb.req)
}

// serveInline runs fn, the serving of a quick request, on the goroutine
// reading the connection. fn gets the hand-off (WillBlock): once called,
// a new goroutine reads the connection (from br, which this one then no
// longer touches), and serveInline reports true: the caller must stop
// reading.
func (c *serverConn) serveInline(br *bufio.Reader, fn func(handOff func())) (handedOff bool) {
	var once sync.Once
	handOff := func() {
		once.Do(func() {
			handedOff = true
			c.s.wg.Add(1) // the reader still counts: the server is not waiting on zero
			go func() {
				defer c.s.wg.Done()
				if !c.readLoop(br) {
					c.finish()
				}
			}()
		})
	}
	fn(handOff)
	return handedOff
}

// identityPreface is the answer to prefaceID: the preface, the length of
// the handler's identity and the identity.
func (s *Server) identityPreface() []byte {
	var id string
	if h, ok := s.h.(Identified); ok {
		id = h.WireIdentity()
	} else if b, ok := s.b.(Identified); ok {
		id = b.WireIdentity()
	}
	id = id[:min(len(id), maxIdentity)]
	b := make([]byte, 10+len(id))
	copy(b, prefaceID[:])
	le.PutUint16(b[8:], uint16(len(id)))
	copy(b[10:], id)
	return b
}

// maxFixedMeta is the largest request field block.
const maxFixedMeta = writeMetaLen

func (c *serverConn) readFailed(err error) {
	if err == io.EOF || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF) {
		return
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return // drained on shutdown
	}
	c.s.log.Debug("lean data path: connection read failed", "remote", c.nc.RemoteAddr(), "err", err)
}

// handle runs one request and sends its answer.
func (c *serverConn) handle(ctx context.Context, cancel context.CancelFunc, h header, req any, payload []byte) {
	defer func() {
		c.mu.Lock()
		delete(c.cancels, h.id)
		c.mu.Unlock()
		cancel()
		<-c.sem
		c.running.Done()
	}()
	var (
		err   error
		flags uint32
		data  []byte
	)
	switch r := req.(type) {
	case *weftv1.WriteChunkRequest:
		var resp *weftv1.WriteChunkResponse
		resp, err = c.s.h.WriteChunk(ctx, r)
		if resp.GetNeedFullChunk() {
			flags |= flagNeedFull
		}
		// Nothing holds the request's data once the handler returned
		// (forwards have been sent).
		if payload != nil {
			PutBuffer(payload)
		}
	case *weftv1.ReadChunkRequest:
		if pr, ok := c.s.h.(PooledReader); ok {
			var buf []byte
			data, buf, err = pr.ReadChunkPooled(ctx, r)
			if buf != nil {
				defer PutBuffer(buf) // after respond: deferred calls run last first
			}
			break
		}
		var resp *weftv1.ReadChunkResponse
		resp, err = c.s.h.ReadChunk(ctx, r)
		data = resp.GetData()
	case *weftv1.SyncFileRequest:
		_, err = c.s.h.SyncFile(ctx, r)
	case *metaBatch:
		data, err = c.batch(ctx, r)
		PutBuffer(payload)
	}
	c.respond(h.id, err, flags, 0, data)
}

// metaBatch is the weftv1.BatchRequest of an opMetaBatch, or why it could
// not be decoded.
type metaBatch struct {
	req *weftv1.BatchRequest
	err error
}

// decodeBatch decodes the payload of an opMetaBatch.
func decodeBatch(body []byte) *metaBatch {
	req := new(weftv1.BatchRequest)
	if err := proto.Unmarshal(body, req); err != nil {
		return &metaBatch{err: status.Errorf(codes.InvalidArgument, "lean path: decode a batch of meta calls: %v", err)}
	}
	return &metaBatch{req: req}
}

// batch serves a batch of meta service calls and returns the encoded
// answer.
func (c *serverConn) batch(ctx context.Context, mb *metaBatch) ([]byte, error) {
	if mb.err != nil {
		return nil, mb.err
	}
	resp, err := c.s.b.Batch(ctx, mb.req)
	if err != nil {
		return nil, err
	}
	out, err := proto.Marshal(resp)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "lean path: encode the answers of a batch of meta calls: %v", err)
	}
	return out, nil
}

// skipPayload reads past a payload nobody will serve.
func skipPayload(br *bufio.Reader, n int) error {
	_, err := br.Discard(n)
	return err
}

// respond sends the answer to request id; aux goes into the header.
func (c *serverConn) respond(id uint64, err error, flags, aux uint32, data []byte) {
	var small [headerLen + respMetaMin + 128]byte
	buf, data := answerHead(small[:0], id, err, flags, aux, data)
	c.wmu.Lock()
	werr := writeFrame(c.nc, buf, data)
	c.wmu.Unlock()
	if werr != nil {
		// The client is gone or the connection broke: the reader sees it.
		c.nc.Close()
	}
}

// answerHead appends to b the header and fields of the answer to request
// id and returns them with the payload to send after them (none with an
// error).
func answerHead(b []byte, id uint64, err error, flags, aux uint32, data []byte) (head, payload []byte) {
	var code, errno uint32
	var msg string
	if err != nil {
		err = fserr.ToStatus(err)
		st := status.Convert(err)
		code, msg = uint32(st.Code()), st.Message()
		if e, ok := fserr.Errno(err); ok {
			errno = uint32(e)
		}
		data = nil
	}
	if len(msg) > maxMeta-respMetaMin {
		msg = msg[:maxMeta-respMetaMin]
	}
	n := headerLen + respMetaMin + len(msg)
	if cap(b) < n {
		b = make([]byte, n)
	}
	b = b[:n]
	header{op: opResponse, metaLen: respMetaMin + len(msg), payloadLen: len(data), id: id, aux: aux}.put(b)
	m := b[headerLen:]
	le.PutUint32(m[0:], code)
	le.PutUint32(m[4:], errno)
	le.PutUint32(m[8:], flags)
	copy(m[12:], msg)
	return b, data
}
