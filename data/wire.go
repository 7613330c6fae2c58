package data

import (
	"errors"
	"net"
	"sync"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// WireOff as Config.WireListen turns the lean data path off.
const WireOff = "off"

// listenWire opens the lean data path listener next to the gRPC listener
// lis (Config.WireListen) and returns it with the address to report to
// the meta service. A nil listener means the lean data path is off.
func (s *Server) listenWire(lis net.Listener) (net.Listener, string, error) {
	if s.cfg.WireListen == WireOff {
		return nil, "", nil
	}
	if s.cfg.Advertise != "" && s.cfg.WireAdvertise == "" {
		s.log.Info("lean data path off: an advertise address is set without a wire advertise address (clients and peers use gRPC)",
			"advertise", s.cfg.Advertise)
		return nil, "", nil
	}
	wl, err := wire.ListenTCP(lis.Addr(), s.cfg.WireListen, "lean data path")
	if err != nil {
		return nil, "", err
	}
	if s.cfg.WireAdvertise != "" {
		wl, a := s.withUnix(wl, s.cfg.WireAdvertise)
		return wl, a, nil
	}
	wl, a := s.withUnix(wl, s.advertiseAddr(wl))
	return wl, a, nil
}

// WireAddr is the lean data path address the server reports to the meta
// service ("" if none); set once Serve has started.
func (s *Server) WireAddr() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.wireAddr
}

// peerClient returns the client of chain member m's data server: chunk
// writes, reads and syncs go over the lean data path when the member has
// a wire address, everything else over gRPC.
func (s *Server) peerClient(m *weftv1.ChainMember) (weftv1.DataClient, error) {
	g, err := s.peers.client(m.GetAddress())
	if err != nil || m.GetWireAddress() == "" {
		return g, err
	}
	w, err := s.wirePeers.client(m.GetWireAddress())
	if err != nil {
		return nil, err
	}
	return wire.NewDataClient(g, w), nil
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
