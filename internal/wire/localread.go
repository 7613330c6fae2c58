package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Reads in place.
//
// A client on the same host as a data server may read a chunk straight
// from the server's file, as the local file system would, instead of
// asking the server for every piece (HDFS calls this a short-circuit
// read). It asks once per chunk (opOpenChunk, over a Unix socket
// connection of its own; several opens may go together, OpenChunks, and
// are answered in turn): the server checks the request as it checks a
// read (it serves the chain at that version),
// opens the chunk's data file read-only and answers with the descriptor
// (SCM_RIGHTS), the chunk's length and version and its block checksums,
// read together under the chunk's read lock. The client then verifies
// the checksums of the blocks it reads itself: what reaches an
// application is checked end to end as on the server path. A block that
// does not match (a write since, or a bad copy) sends the client back to
// the server (with flagVerify, which makes the server check the whole
// chunk and report and repair a bad copy), and then to the ordinary read
// path.

// LocalChunk is a chunk of a data server on this host, opened for
// reading in place.
type LocalChunk struct {
	// Opened is the chunk's file (nil if the server holds no such chunk:
	// it reads as zeros) and where its blocks are, as package data/chunk
	// (the chunk file format) describes them.
	chunk.Opened
	// Lease is how long the chunk may be read in place, counted from the
	// request: the server answers for its copy only while it is sure to
	// be serving the chain (see the data server's fencing).
	Lease time.Duration
}

// offsetShift places LocalChunk.DataOffset in the top bits of the length
// in an open's answer.
const offsetShift = 40

// maxLocalSums bounds the checksums of one chunk (64 MiB in 64 KiB
// blocks).
const maxLocalSums = 1024

// ChunkOpener is implemented by a Handler that opens chunks for clients
// on its host to read in place.
type ChunkOpener interface {
	OpenChunkRead(ctx context.Context, req *weftv1.ReadChunkRequest, verify bool) (*LocalChunk, error)
	// ReadLease is how long, from now, chunks opened in place may be
	// read (see LocalChunk.Lease); <= 0 while the server serves nothing.
	ReadLease() time.Duration
}

// ErrNotLocal means the data server is not on this host (or cannot hand
// out its files): read through it.
var ErrNotLocal = errors.New("the data server cannot be read in place from here")

// localOffEnv turns reads in place off for a process ("off").
const localOffEnv = "WEFT_LOCAL_READS"

// LocalReadsWanted reports whether this process reads chunks of data
// servers on its host in place (WEFT_LOCAL_READS is not "off"), as the
// environment said at the first call: it is asked on every read.
var LocalReadsWanted = sync.OnceValue(func() bool { return os.Getenv(localOffEnv) != "off" })

// lease serves opLease.
func (c *serverConn) lease(id uint64) {
	op, ok := c.s.h.(ChunkOpener)
	if !ok {
		c.respond(id, status.Error(codes.Unimplemented, "lean data path: this server does not hand out chunk files"), 0, 0, nil)
		return
	}
	d := op.ReadLease()
	if d <= 0 {
		c.respond(id, status.Error(codes.Unavailable, "lean data path: this server serves nothing now (cut off from the meta service)"), 0, 0, nil)
		return
	}
	c.respond(id, nil, flagMissing, leaseMs(d), nil)
}

// openChunk serves opOpenChunk: the answer carries the chunk file's
// descriptor.
func (c *serverConn) openChunk(id uint64, req *weftv1.ReadChunkRequest, verify bool) {
	op, ok := c.s.h.(ChunkOpener)
	uc, isUnix := c.nc.(*net.UnixConn)
	if !ok || !isUnix {
		c.respond(id, status.Error(codes.Unimplemented, "lean data path: this server does not hand out chunk files (only over its Unix socket)"), 0, 0, nil)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), localOpenTimeout)
	defer cancel()
	lc, err := op.OpenChunkRead(ctx, req, verify)
	if err != nil {
		c.respond(id, err, 0, 0, nil)
		return
	}
	if lc.File == nil {
		c.respond(id, nil, flagMissing, leaseMs(lc.Lease), nil)
		return
	}
	defer lc.File.Close()
	if len(lc.Sums) > maxLocalSums {
		c.respond(id, status.Errorf(codes.Internal, "lean data path: chunk with %d checksums", len(lc.Sums)), 0, 0, nil)
		return
	}
	// The sums, then a byte per block: its slot.
	payload := make([]byte, 16+5*len(lc.Sums))
	le.PutUint64(payload[0:], lc.Version)
	// The data offset rides in the length's top bits (a chunk is at
	// most 64 MiB): a client that knows nothing of it sees a length
	// that does not match the checksums and reads through the server.
	le.PutUint64(payload[8:], uint64(lc.Length)|uint64(lc.DataOffset)<<offsetShift)
	for i, s := range lc.Sums {
		le.PutUint32(payload[16+4*i:], s)
	}
	if lc.Slots != nil {
		copy(payload[16+4*len(lc.Sums):], lc.Slots)
	}
	head, payload := answerHead(nil, id, nil, 0, leaseMs(lc.Lease), payload)
	frame := append(head, payload...)
	c.wmu.Lock()
	n, _, err := uc.WriteMsgUnix(frame, unix.UnixRights(int(lc.File.Fd())), nil)
	if err == nil && n < len(frame) {
		_, err = uc.Write(frame[n:])
	}
	c.wmu.Unlock()
	if err != nil {
		c.nc.Close()
	}
}

// leaseMs is a lease in whole milliseconds, for the answer's aux field.
func leaseMs(d time.Duration) uint32 {
	return uint32(max(d.Milliseconds(), 0))
}

// localOpenTimeout bounds one opOpenChunk.
const localOpenTimeout = 5 * time.Second

// localConn is a Unix socket connection for opOpenChunk: one request, or
// one round of requests sent together, at a time.
type localConn struct {
	uc *net.UnixConn
	fr *fdReader
	br *bufio.Reader
	id uint64
}

// maxIdleLocal bounds the idle opOpenChunk connections a Client keeps.
const maxIdleLocal = 4

// localState of a Client.
const (
	localUnknown int32 = iota
	localYes
	localNo
)

// MaybeLocal reports whether the server may be read in place: it has a
// Unix socket, and none of the tries so far showed it is not on this
// host or cannot hand out files.
func (c *Client) MaybeLocal() bool {
	return c.a.Unix != "" && c.local.Load() != localNo && !c.unixOff.Load()
}

// OpenChunk opens a chunk of the server for reading in place; see
// LocalChunk. It fails with ErrNotLocal when the server is not on this
// host or does not hand out files, else with the error the server
// answered (the status codes of a read). With verify the server first
// checks every block of the chunk (it reports and repairs a bad copy,
// and answers EIO).
func (c *Client) OpenChunk(ctx context.Context, req *weftv1.ReadChunkRequest, verify bool) (*LocalChunk, error) {
	if !c.MaybeLocal() {
		return nil, ErrNotLocal
	}
	lc, err := c.takeLocalConn(ctx)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	c.openRounds.Add(1)
	out, answered, err := lc.open(ctx, req, verify)
	switch {
	case err == nil:
		c.local.Store(localYes)
		c.setLease(sent, out.Lease)
		c.putLocalConn(lc)
	case answered && status.Code(err) == codes.Unimplemented:
		c.local.Store(localNo)
		lc.uc.Close()
		return nil, fmt.Errorf("%w: %v", ErrNotLocal, err)
	case answered:
		c.putLocalConn(lc) // the server said no: the connection is fine
	default:
		lc.uc.Close()
		err = status.Errorf(codes.Unavailable, "open a chunk of data server %s in place: %v", c.a.Unix, err)
	}
	return out, err
}

// OpenChunks opens several chunks of this server in place at once: the
// requests go together on one connection and the server answers them one
// after another, so a reader that opens the chunks ahead of it pays one
// round trip (and one wake-up of the server) for all of them. Results and
// errors are per request, as OpenChunk's.
func (c *Client) OpenChunks(ctx context.Context, reqs []*weftv1.ReadChunkRequest) ([]*LocalChunk, []error) {
	outs, errs := make([]*LocalChunk, len(reqs)), make([]error, len(reqs))
	fail := func(err error) ([]*LocalChunk, []error) {
		for i := range errs {
			errs[i] = err
		}
		return outs, errs
	}
	if !c.MaybeLocal() {
		return fail(ErrNotLocal)
	}
	lc, err := c.takeLocalConn(ctx)
	if err != nil {
		return fail(err)
	}
	sent := time.Now()
	c.openRounds.Add(1)
	outs, errs, broken := lc.openMany(ctx, reqs)
	if broken != nil {
		lc.uc.Close()
		for i, err := range errs {
			if errors.Is(err, broken) {
				errs[i] = status.Errorf(codes.Unavailable, "open a chunk of data server %s in place: %v", c.a.Unix, err)
			}
		}
	}
	for i, out := range outs {
		switch {
		case errs[i] == nil:
			c.local.Store(localYes)
			c.setLease(sent, out.Lease)
		case status.Code(errs[i]) == codes.Unimplemented && !errors.Is(errs[i], broken):
			c.local.Store(localNo)
			errs[i] = fmt.Errorf("%w: %v", ErrNotLocal, errs[i])
		}
	}
	if broken == nil {
		c.putLocalConn(lc)
	}
	return outs, errs
}

// takeLocalConn returns an idle opOpenChunk connection or dials one.
func (c *Client) takeLocalConn(ctx context.Context) (*localConn, error) {
	c.locMu.Lock()
	if n := len(c.locIdle); n > 0 {
		lc := c.locIdle[n-1]
		c.locIdle = c.locIdle[:n-1]
		c.locMu.Unlock()
		return lc, nil
	}
	closed := c.locClosed
	c.locMu.Unlock()
	if closed {
		return nil, ErrNotLocal
	}
	uc, err := dialUnixChecked(ctx, c.a)
	if err != nil {
		if errors.Is(err, errNotThisServer) {
			c.local.Store(localNo)
			return nil, fmt.Errorf("%w: %v", ErrNotLocal, err)
		}
		return nil, status.Errorf(codes.Unavailable, "connect to data server %s to read in place: %v", c.a.Unix, err)
	}
	uc.SetDeadline(time.Time{})
	fr := &fdReader{uc: uc}
	return &localConn{uc: uc, fr: fr, br: bufio.NewReaderSize(fr, 8<<10)}, nil
}

// putLocalConn keeps an idle connection for the next open.
func (c *Client) putLocalConn(lc *localConn) {
	c.locMu.Lock()
	defer c.locMu.Unlock()
	if c.locClosed || len(c.locIdle) >= maxIdleLocal {
		lc.uc.Close()
		return
	}
	c.locIdle = append(c.locIdle, lc)
}

// closeLocal closes the idle opOpenChunk connections (Close).
func (c *Client) closeLocal() {
	c.locMu.Lock()
	defer c.locMu.Unlock()
	c.locClosed = true
	for _, lc := range c.locIdle {
		lc.uc.Close()
	}
	c.locIdle = nil
}

// begin prepares the connection for a round of requests: its deadline
// is ctx's (localOpenTimeout without one), which it returns, and
// descriptors left from an earlier round are closed (none are expected;
// a stale one is never handed out). The caller clears the deadline.
func (lc *localConn) begin(ctx context.Context) time.Time {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(localOpenTimeout)
	}
	lc.uc.SetDeadline(dl)
	lc.fr.closeAll()
	return dl
}

// open sends one opOpenChunk (opLease without req) and reads its
// answer. answered tells an error the server answered (the connection
// is fine) from one that leaves the connection unusable.
func (lc *localConn) open(ctx context.Context, req *weftv1.ReadChunkRequest, verify bool) (out *LocalChunk, answered bool, err error) {
	dl := lc.begin(ctx)
	defer lc.uc.SetDeadline(time.Time{})
	lc.id++
	var b [headerLen + readMetaLen]byte
	if req == nil {
		header{op: opLease, id: lc.id}.put(b[:])
		if _, err := lc.uc.Write(b[:headerLen]); err != nil {
			return nil, false, err
		}
	} else {
		header{op: opOpenChunk, metaLen: readMetaLen, id: lc.id, timeoutMs: uint32(max(time.Until(dl).Milliseconds(), 1))}.put(b[:])
		putRead(b[headerLen:], req)
		if verify {
			le.PutUint32(b[headerLen+44:], flagVerify)
		}
		if _, err := lc.uc.Write(b[:]); err != nil {
			return nil, false, err
		}
	}
	out, _, answered, err = lc.answer(lc.id, lc.id)
	return out, answered, err
}

// answer reads the answer to an open or lease request whose id is in
// [lo, hi] (answers to requests sent together may come in any order;
// each descriptor travels with the bytes of its own answer, so they are
// taken in the order the answers are read). answered tells an error the
// server answered (the connection is fine) from one that leaves the
// connection unusable.
func (lc *localConn) answer(lo, hi uint64) (out *LocalChunk, id uint64, answered bool, err error) {
	var hb [headerLen]byte
	if err := readFull(lc.br, hb[:]); err != nil {
		return nil, 0, false, err
	}
	h, err := parseHeader(hb[:])
	if err == nil && (h.op != opResponse || h.id < lo || h.id > hi || h.metaLen < respMetaMin || h.metaLen > maxMeta ||
		h.payloadLen > 16+4*maxLocalSums) {
		err = fmt.Errorf("%w: unexpected answer (op %d, id %d) to an open", errProtocol, h.op, h.id)
	}
	if err != nil {
		return nil, 0, false, err
	}
	rest := make([]byte, h.metaLen+h.payloadLen)
	if err := readFull(lc.br, rest); err != nil {
		return nil, 0, false, err
	}
	cl := call{code: le.Uint32(rest[0:]), errno: le.Uint32(rest[4:]), flags: le.Uint32(rest[8:])}
	if cl.code != 0 {
		cl.msg = string(rest[respMetaMin:h.metaLen])
		return nil, h.id, true, cl.callError()
	}
	if cl.flags&flagMissing != 0 {
		return &LocalChunk{Lease: time.Duration(h.aux) * time.Millisecond}, h.id, true, nil
	}
	// Only an answer with a file carries a descriptor.
	fd := lc.fr.take()
	p := rest[h.metaLen:]
	if fd < 0 || len(p) < 16 || (len(p)-16)%5 != 0 {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, 0, false, fmt.Errorf("%w: an open answered without a descriptor or with %d bytes", errProtocol, len(p))
	}
	out = &LocalChunk{Opened: chunk.Opened{
		File:       os.NewFile(uintptr(fd), "chunk"),
		Version:    le.Uint64(p[0:]),
		Length:     int64(le.Uint64(p[8:]) & (1<<offsetShift - 1)),
		DataOffset: int64(le.Uint64(p[8:]) >> offsetShift),
		Sums:       make([]uint32, (len(p)-16)/5),
	}, Lease: time.Duration(h.aux) * time.Millisecond}
	for i := range out.Sums {
		out.Sums[i] = le.Uint32(p[16+4*i:])
	}
	for i, s := range p[16+4*len(out.Sums):] {
		if s != 0 && out.Slots == nil {
			out.Slots = make([]uint8, len(out.Sums))
		}
		if out.Slots != nil {
			out.Slots[i] = s
		}
	}
	if err := out.Check(); err != nil {
		out.File.Close()
		return nil, h.id, true, status.Errorf(codes.Internal, "lean data path: %v", err)
	}
	return out, h.id, true, nil
}

// openMany sends one opOpenChunk per request in one write and reads
// their answers: outs and errs per request; broken, when set, is why the
// connection is no longer usable (the requests it left unanswered fail
// with it).
func (lc *localConn) openMany(ctx context.Context, reqs []*weftv1.ReadChunkRequest) (outs []*LocalChunk, errs []error, broken error) {
	dl := lc.begin(ctx)
	defer lc.uc.SetDeadline(time.Time{})
	const frame = headerLen + readMetaLen
	b := make([]byte, len(reqs)*frame)
	first := lc.id + 1
	for i, req := range reqs {
		lc.id++
		header{op: opOpenChunk, metaLen: readMetaLen, id: lc.id, timeoutMs: uint32(max(time.Until(dl).Milliseconds(), 1))}.put(b[i*frame:])
		putRead(b[i*frame+headerLen:], req)
	}
	outs, errs = make([]*LocalChunk, len(reqs)), make([]error, len(reqs))
	if _, err := lc.uc.Write(b); err != nil {
		broken = err
	}
	seen := make([]bool, len(reqs))
	for range reqs {
		if broken != nil {
			break
		}
		out, id, answered, err := lc.answer(first, lc.id)
		if !answered {
			broken = err
			break
		}
		if i := id - first; seen[i] {
			if out != nil && out.File != nil {
				out.File.Close()
			}
			broken = fmt.Errorf("%w: two answers to open %d", errProtocol, id)
		} else {
			seen[i], outs[i], errs[i] = true, out, err
		}
	}
	if broken != nil {
		for i := range reqs {
			if !seen[i] {
				errs[i] = broken
			}
		}
	}
	return outs, errs, broken
}

// localFields are a Client's state for reads in place.
type localFields struct {
	local      atomic.Int32 // localUnknown, localYes, localNo
	leaseUntil atomic.Int64 // unix nanos: chunks opened in place may be read until then
	leaseLen   atomic.Int64 // the last lease granted
	renewing   atomic.Bool
	locMu      sync.Mutex
	locIdle    []*localConn
	locClosed  bool
}

// setLease records a lease of d granted in answer to a request sent at
// sent.
func (c *Client) setLease(sent time.Time, d time.Duration) {
	c.leaseLen.Store(int64(d))
	c.leaseUntil.Store(sent.Add(d).UnixNano())
}

// LeaseValid reports whether chunks opened in place on this server may be
// read now. The lease is renewed in the background once half of it is
// gone, and at once when it is over.
func (c *Client) LeaseValid(ctx context.Context) bool {
	if c.LeaseFresh(ctx) {
		return true
	}
	c.renewLease(ctx)
	return c.leaseUntil.Load() > time.Now().UnixNano()
}

// LeaseFresh is LeaseValid without waiting: false once the lease is over
// (the next open renews it); it starts a renewal in the background once
// half of it is gone. ctx bounds that renewal.
func (c *Client) LeaseFresh(ctx context.Context) bool {
	left := c.leaseUntil.Load() - time.Now().UnixNano()
	if left > c.leaseLen.Load()/2 {
		return true
	}
	if left > 0 && c.renewing.CompareAndSwap(false, true) {
		go func() {
			defer c.renewing.Store(false)
			rctx, cancel := context.WithTimeout(ctx, localOpenTimeout)
			defer cancel()
			c.renewLease(rctx)
		}()
	}
	return left > 0
}

// renewLease asks the server for a new lease (opLease).
func (c *Client) renewLease(ctx context.Context) {
	if !c.MaybeLocal() {
		return
	}
	lc, err := c.takeLocalConn(ctx)
	if err != nil {
		return
	}
	sent := time.Now()
	out, answered, err := lc.open(ctx, nil, false)
	if err != nil {
		if answered {
			c.putLocalConn(lc)
		} else {
			lc.uc.Close()
		}
		c.leaseUntil.Store(0)
		return
	}
	c.setLease(sent, out.Lease)
	c.putLocalConn(lc)
}
