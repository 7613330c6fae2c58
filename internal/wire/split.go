package wire

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// One port serves both gRPC and the lean protocol: Split tells each
// connection apart by its first bytes, which it peeks at (MSG_PEEK)
// without taking them, so each server gets the connection exactly as
// accepted (a *net.TCPConn: writev, socket options) and reads the
// connection from its first byte. A lean connection opens with the
// preface "weftwir1" or "weftwid1"; a gRPC (HTTP/2) connection with
// "PRI * HTTP/2.0". A server thus has one address, and a restart on
// another port changes one address, not two that must be learnt
// together.

// leanMagic starts every lean connection (both prefaces).
var leanMagic = [4]byte{'w', 'e', 'f', 't'}

// classifyTimeout bounds how long a new connection may take to send its
// first bytes.
const classifyTimeout = 10 * time.Second

// Split serves the connections of lis to two listeners: lean gets those
// that open with the lean protocol's preface, other the rest (gRPC).
// Closing both closes lis; Addr of both is lis's.
func Split(lis net.Listener, log *slog.Logger) (other, lean net.Listener) {
	s := &splitter{lis: lis, log: log, done: make(chan struct{})}
	s.other = &subListener{s: s, conns: make(chan net.Conn), closedCh: make(chan struct{})}
	s.lean = &subListener{s: s, conns: make(chan net.Conn), closedCh: make(chan struct{})}
	s.open = 2
	go s.acceptLoop()
	return s.other, s.lean
}

type splitter struct {
	lis         net.Listener
	log         *slog.Logger
	other, lean *subListener

	mu      sync.Mutex
	open    int // sub-listeners not closed
	err     error
	done    chan struct{} // closed when accepting ends
	endOnce sync.Once
}

func (s *splitter) acceptLoop() {
	for {
		nc, err := s.lis.Accept()
		if err != nil {
			// Out of descriptors (EMFILE), a timeout: wait and go on.
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			s.end(err)
			return
		}
		go s.classify(nc)
	}
}

// end stops both sub-listeners with err.
func (s *splitter) end(err error) {
	s.endOnce.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.done)
	})
}

// classify peeks at the first bytes of nc and hands it to its listener.
func (s *splitter) classify(nc net.Conn) {
	nc.SetReadDeadline(time.Now().Add(classifyTimeout))
	var b [len(leanMagic)]byte
	n, err := peekFull(nc, b[:])
	nc.SetReadDeadline(time.Time{})
	if err != nil {
		if n > 0 || !errors.Is(err, errPeekEOF) {
			s.log.Debug("a connection closed or stalled before saying which protocol it speaks", "remote", nc.RemoteAddr(), "err", err)
		}
		nc.Close()
		return
	}
	to := s.other
	if b == leanMagic {
		to = s.lean
	}
	select {
	case to.conns <- nc:
	case <-s.done:
		nc.Close()
	case <-to.closed():
		nc.Close()
	}
}

// errPeekEOF: the connection ended before its first bytes.
var errPeekEOF = errors.New("connection closed before its first bytes")

// peekFull peeks at len(b) bytes of nc without consuming them, waiting
// (within nc's read deadline) until that many arrived.
func peekFull(nc net.Conn, b []byte) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, errors.New("connection without a file descriptor: cannot peek")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	for {
		var n int
		var perr error
		err := rc.Read(func(fd uintptr) bool {
			n, _, perr = unix.Recvfrom(int(fd), b, unix.MSG_PEEK)
			return perr != unix.EAGAIN
		})
		switch {
		case err != nil:
			return n, err
		case perr != nil:
			return 0, perr
		case n == 0:
			return 0, errPeekEOF
		case n == len(b):
			return n, nil
		}
		// Part of the first bytes is there: the rest follows at once.
		time.Sleep(time.Millisecond)
	}
}

// subListener is one side of a Split.
type subListener struct {
	s         *splitter
	conns     chan net.Conn
	closeOnce sync.Once
	closedCh  chan struct{} // closed by Close
}

func (l *subListener) closed() chan struct{} { return l.closedCh }

// Accept returns the next connection of this side.
func (l *subListener) Accept() (net.Conn, error) {
	select {
	case nc := <-l.conns:
		return nc, nil
	case <-l.closed():
		return nil, net.ErrClosed
	case <-l.s.done:
		l.s.mu.Lock()
		err := l.s.err
		l.s.mu.Unlock()
		return nil, err
	}
}

// Close stops this side; the shared listener closes with the last side.
func (l *subListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.closed())
		l.s.mu.Lock()
		l.s.open--
		last := l.s.open == 0
		l.s.mu.Unlock()
		if last {
			err = l.s.lis.Close()
		}
	})
	return err
}

// Addr is the shared listener's address.
func (l *subListener) Addr() net.Addr { return l.s.lis.Addr() }
