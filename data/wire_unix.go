package data

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/weft-fs/weft/internal/wire"
)

// wireSocketName is the lean data path's Unix socket in the server's
// directory, for clients and peers on the same host.
const wireSocketName = "wire.sock"

// maxSocketPath is the longest path a Unix socket address holds
// (sun_path, with its terminating NUL).
const maxSocketPath = 107

// WireIdentity is the identity the lean data path answers on its Unix
// socket: the server's UUID and a random part new at every start, so that
// a client never mistakes another server (or this one restarted, at
// another address) for the one whose address it holds.
func (s *Server) WireIdentity() string {
	s.wireIDOnce.Do(func() {
		var b [8]byte
		rand.Read(b[:])
		s.wireID = s.serverUUID + "." + hex.EncodeToString(b[:])
	})
	return s.wireID
}

// listenWireUnix opens the lean data path's Unix socket in the server's
// directory. It returns nil (and logs why) when there is none: the path
// too long for a socket, or another process serving it.
func (s *Server) listenWireUnix() net.Listener {
	path, err := filepath.Abs(filepath.Join(s.cfg.Dir, wireSocketName))
	if err != nil || len(path) > maxSocketPath {
		s.log.Info("lean data path: no Unix socket for local clients (the directory's path is too long for one); they use TCP",
			"path", path)
		return nil
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			s.log.Warn("lean data path: no Unix socket for local clients: a file that is not a socket is in the way; remove it",
				"path", path)
			return nil
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			s.log.Warn("lean data path: no Unix socket for local clients: another process serves this server's socket",
				"path", path)
			return nil
		}
		os.Remove(path) // left behind by a server that is gone
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		s.log.Warn("lean data path: no Unix socket for local clients; they use TCP", "path", path, "err", err)
		return nil
	}
	return l
}

// multiListener accepts the connections of several listeners.
type multiListener struct {
	ls    []net.Listener
	conns chan net.Conn
	errs  chan error
	done  chan struct{}
	once  sync.Once
}

// listenBoth returns a listener of the connections of both ls; its
// address is the first's.
func listenBoth(ls ...net.Listener) net.Listener {
	m := &multiListener{ls: ls, conns: make(chan net.Conn), errs: make(chan error, len(ls)), done: make(chan struct{})}
	for _, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					m.errs <- err
					return
				}
				select {
				case m.conns <- c:
				case <-m.done:
					c.Close()
					return
				}
			}
		}()
	}
	return m
}

// Accept returns the next connection of any listener, or the first error.
func (m *multiListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case err := <-m.errs:
		return nil, err
	case <-m.done:
		return nil, net.ErrClosed
	}
}

// Close closes every listener.
func (m *multiListener) Close() error {
	m.once.Do(func() {
		close(m.done)
		for _, l := range m.ls {
			l.Close()
		}
	})
	return nil
}

// Addr is the first listener's address.
func (m *multiListener) Addr() net.Addr { return m.ls[0].Addr() }

// withUnix adds the Unix socket to the lean data path's listener wl and
// its address to the reported address addr, if there is one.
func (s *Server) withUnix(wl net.Listener, addr string) (net.Listener, string) {
	ul := s.listenWireUnix()
	if ul == nil {
		return wl, addr
	}
	a := wire.Addr{TCP: addr, Unix: ul.Addr().String(), ID: s.WireIdentity()}
	return listenBoth(wl, ul), a.String()
}
