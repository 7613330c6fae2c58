// Package faultproxy is a TCP proxy for failure tests: it listens on
// 127.0.0.1 (a port the system picks) and forwards every connection to an
// upstream address, and it can be told to misbehave while it runs.
//
//   - Cut drops every open connection and refuses new ones (accepted and
//     closed at once), as a network that resets connections;
//   - Blackhole keeps connections open but silently drops every byte in
//     both directions, and lets new connections hang the same way, as a
//     network partition that only timeouts reveal;
//   - Restore ends either: new connections are forwarded again (the
//     connections cut or blackholed stay dead; their peers reconnect);
//   - SetLatency delays every forwarded segment, in each direction, as a
//     long link does: a delay, not a limit on the rate.
//
// Point a process at Addr() instead of the upstream (for a server: make
// it advertise the proxy's address) and the test controls its network.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int

const (
	// Forward passes traffic through.
	Forward Mode = iota
	// Refuse closes every connection (Cut).
	Refuse
	// Drop swallows all traffic without closing anything (Blackhole).
	Drop
)

func (m Mode) String() string {
	switch m {
	case Forward:
		return "forward"
	case Refuse:
		return "refuse"
	case Drop:
		return "drop"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Proxy forwards TCP connections from its listener to an upstream address.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	mode    Mode
	latency time.Duration
	conns   map[*link]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// link is one proxied connection: the accepted side and the upstream side.
type link struct {
	down, up net.Conn
	once     sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.down.Close()
		if l.up != nil {
			l.up.Close()
		}
	})
}

// New starts a proxy on 127.0.0.1:0 that forwards to upstream (host:port;
// it need not be listening yet: a connection it refuses is closed).
func New(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen on 127.0.0.1: %w", err)
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's address (host:port), to be used instead of the
// upstream's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream is the address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

// Mode reports what the proxy does now.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() { p.setMode(Refuse) }

// Blackhole drops all traffic of open and new connections, without
// closing them, until Restore.
func (p *Proxy) Blackhole() { p.setMode(Drop) }

// Restore forwards new connections again. Connections that were cut or
// blackholed are closed, so their peers reconnect through a working path.
func (p *Proxy) Restore() { p.setMode(Forward) }

// SetLatency delays every forwarded segment by d (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

func (p *Proxy) setMode(m Mode) {
	p.mu.Lock()
	old := p.mode
	p.mode = m
	var kill []*link
	// Going to Refuse closes everything now; leaving Drop closes the
	// blackholed connections so that nothing half-dead stays around.
	if m == Refuse || (old == Drop && m != Drop) {
		for l := range p.conns {
			kill = append(kill, l)
			delete(p.conns, l)
		}
	}
	p.mu.Unlock()
	for _, l := range kill {
		l.close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	var kill []*link
	for l := range p.conns {
		kill = append(kill, l)
		delete(p.conns, l)
	}
	p.mu.Unlock()
	for _, l := range kill {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) handle(down net.Conn) {
	defer p.wg.Done()
	l := &link{down: down}
	p.mu.Lock()
	if p.closed || p.mode == Refuse {
		p.mu.Unlock()
		down.Close()
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
		l.close()
	}()
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if _, ok := p.conns[l]; !ok { // cut while dialling
		p.mu.Unlock()
		up.Close()
		return
	}
	l.up = up
	p.mu.Unlock()
	done := make(chan bool, 2)
	go func() { done <- p.pipe(up, down) }()
	go func() { done <- p.pipe(down, up) }()
	if eof := <-done; !eof {
		l.close() // a direction failed: end both
	}
	<-done
}

// segment is a piece of one direction's traffic on its way through the
// proxy: the bytes read, when they may be written, and how reading ended
// (err set on the last one).
type segment struct {
	data []byte
	due  time.Time
	err  error
}

// delayQueue bounds the segments one direction holds back (64 KiB each):
// with a latency, a connection carries up to this much per latency, as a
// link with that delay and a large window would.
const delayQueue = 1024

// pipe copies from src to dst, applying the proxy's mode and latency to
// every segment. The latency is a delay, not a rate: segments read one
// after another are written one after another, each the latency after it
// was read, so a connection's throughput does not depend on it. pipe
// reports whether src ended cleanly (then dst's write side is closed and
// the other direction may go on).
func (p *Proxy) pipe(dst, src net.Conn) bool {
	q := make(chan segment, delayQueue)
	stop := make(chan struct{}) // the writer gave up: the reader ends too
	defer close(stop)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			p.mu.Lock()
			lat := p.latency
			p.mu.Unlock()
			select {
			case q <- segment{data: buf[:n], due: time.Now().Add(lat), err: err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for sg := range q {
		if d := time.Until(sg.due); d > 0 {
			time.Sleep(d)
		}
		if len(sg.data) > 0 {
			p.mu.Lock()
			mode := p.mode
			p.mu.Unlock()
			switch mode {
			case Refuse:
				src.Close() // ends the reader
				return false
			case Drop:
				// swallowed
			default:
				if _, werr := dst.Write(sg.data); werr != nil {
					src.Close()
					return false
				}
			}
		}
		if sg.err != nil {
			if sg.err != io.EOF {
				return false
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return true
		}
	}
	return false
}
