package data

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// listenWire shares lis between gRPC and the lean data path (see
// wire.Split) and adds the lean data path's Unix socket. It returns the
// listener gRPC serves, the lean data path's and the lean data path
// address to report: the server's address addr, with the Unix socket and
// the server's incarnation.
func (s *Server) listenWire(lis net.Listener, addr string) (grpcL, wireL net.Listener, wireAddr string) {
	grpcL, wireL = wire.Split(lis, s.log)
	if s.cfg.NoUnixSocket {
		return grpcL, wireL, addr
	}
	wireL, wireAddr = s.withUnix(wireL, addr)
	return grpcL, wireL, wireAddr
}

// WireAddr is the lean data path address the server reports to the meta
// service; set once Serve has started.
func (s *Server) WireAddr() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.wireAddr
}

// chunkPeer returns the lean data path client of chain member m's data
// server, which forwarded chunk writes take; other calls between servers
// (syncs, truncates, pushes, resync) go over gRPC (s.peers).
func (s *Server) chunkPeer(m *weftv1.ChainMember) (*wire.Client, error) {
	if m.GetWireAddress() == "" {
		return nil, fmt.Errorf("data server %s has no lean data path address", m.GetAddress())
	}
	return s.wirePeers.client(m.GetWireAddress())
}

// wirePool keeps one lean data path client per peer wire address.
type wirePool struct {
	mu      sync.Mutex
	clients map[string]*wire.Client
	closed  bool
}

func (p *wirePool) client(addr string) (*wire.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("data server is shutting down")
	}
	if c := p.clients[addr]; c != nil {
		return c, nil
	}
	if p.clients == nil {
		p.clients = make(map[string]*wire.Client)
	}
	c := wire.NewClient(addr, 0)
	p.clients[addr] = c
	return c, nil
}

func (p *wirePool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for addr, c := range p.clients {
		c.Close()
		delete(p.clients, addr)
	}
}

// liveAddresses returns every member address of table (gRPC and lean).
func liveAddresses(table *weftv1.ChainTable) map[string]bool {
	live := make(map[string]bool)
	for _, c := range table.GetChains() {
		for _, m := range c.GetMembers() {
			live[m.GetAddress()], live[m.GetWireAddress()] = true, true
		}
	}
	return live
}

// dropGone closes the lean data path clients of addresses not in live
// (incarnations of peers that restarted elsewhere).
func (p *wirePool) dropGone(live map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.clients {
		if !live[addr] {
			c.Close()
			delete(p.clients, addr)
		}
	}
}
