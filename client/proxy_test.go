package client

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingProxy forwards TCP connections to a data server, counting the
// bytes the server sends (read data mostly) and optionally delaying them,
// so tests see which replica served reads and can make one look far away.
type countingProxy struct {
	ln       net.Listener
	upstream string
	sent     atomic.Int64 // bytes from the server to its peers
	delay    atomic.Int64 // nanoseconds added before each forwarded segment from the server
	held     atomic.Bool  // blackholed: bytes are dropped, connections hang
	done     chan struct{}

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newCountingProxy(t *testing.T, upstream string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, upstream: upstream, conns: make(map[net.Conn]struct{}), done: make(chan struct{})}
	t.Cleanup(p.close)
	go p.accept()
	return p
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

func (p *countingProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *countingProxy) accept() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.held.Load() {
			p.track(down) // hangs until the proxy closes
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			down.Close()
			continue
		}
		if !p.track(down) || !p.track(up) {
			down.Close()
			up.Close()
			continue
		}
		go p.pipe(up, down, nil)
		go p.pipe(down, up, &p.sent)
	}
}

// blackhole drops every byte from now on and keeps connections open
// without answering, as a network partition does.
func (p *countingProxy) blackhole() { p.held.Store(true) }

// pipe copies src to dst until either fails, then closes both (while
// blackholed: leaves them hanging until the proxy closes).
func (p *countingProxy) pipe(dst, src net.Conn, count *atomic.Int64) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if p.held.Load() {
			if err != nil {
				<-p.done
				return
			}
			continue
		}
		if n > 0 {
			if count != nil {
				if d := p.delay.Load(); d > 0 {
					time.Sleep(time.Duration(d))
				}
				count.Add(int64(n))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// close stops accepting and cuts every connection.
func (p *countingProxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	close(p.done)
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
}
