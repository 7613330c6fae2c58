package wire

import (
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// maxSocketPath is the longest path a Unix socket address holds
// (sun_path, with its terminating NUL).
const maxSocketPath = 107

// ListenUnix opens a server's Unix socket at path (in the server's
// directory), for clients on the same host. It returns nil, and logs why,
// when there can be none: the path too long for a socket, something that
// is not a socket in the way, or another process serving it. what names
// the path in the log ("lean data path").
func ListenUnix(path string, what string, log *slog.Logger) net.Listener {
	path, err := filepath.Abs(path)
	if err != nil || len(path) > maxSocketPath {
		log.Info(what+": no Unix socket for local clients (the directory's path is too long for one); they use TCP",
			"path", path)
		return nil
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			log.Warn(what+": no Unix socket for local clients: a file that is not a socket is in the way; remove it",
				"path", path)
			return nil
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			log.Warn(what+": no Unix socket for local clients: another process serves this server's socket",
				"path", path)
			return nil
		}
		os.Remove(path) // left behind by a server that is gone
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		log.Warn(what+": no Unix socket for local clients; they use TCP", "path", path, "err", err)
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

// ListenBoth returns a listener of the connections of all ls; its
// address is the first's.
func ListenBoth(ls ...net.Listener) net.Listener {
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

// fdReader reads a Unix socket connection and keeps the descriptors that
// come with its bytes (SCM_RIGHTS): the descriptors of chunks opened in
// place (localread.go).
type fdReader struct {
	uc  *net.UnixConn
	oob [64]byte

	mu  sync.Mutex
	fds []int
}

// Read implements io.Reader.
func (r *fdReader) Read(p []byte) (int, error) {
	n, oobn, _, _, err := r.uc.ReadMsgUnix(p, r.oob[:])
	if oobn > 0 {
		r.keep(r.oob[:oobn])
	}
	return max(n, 0), err
}

// keep parses control messages and keeps their descriptors.
func (r *fdReader) keep(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		r.mu.Lock()
		r.fds = append(r.fds, fds...)
		r.mu.Unlock()
	}
}

// take returns the oldest descriptor received, or -1.
func (r *fdReader) take() int {
	if r == nil {
		return -1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.fds) == 0 {
		return -1
	}
	fd := r.fds[0]
	r.fds = r.fds[1:]
	return fd
}

// closeAll closes the descriptors nobody took.
func (r *fdReader) closeAll() {
	if r == nil {
		return
	}
	for fd := r.take(); fd >= 0; fd = r.take() {
		unix.Close(fd)
	}
}
