package meta

import (
	"net"
	"path/filepath"

	"github.com/weft-fs/weft/internal/wire"
)

// The meta service's lean path: batches of namespace calls (batch.go)
// over package wire's framing instead of gRPC, the one way clients send
// namespace calls. It shares the gRPC port (wire.Split), so a meta
// server's address names both, and clients on the same host also reach
// it on a Unix socket in the service's directory. A getattr's round trip
// costs 110-125 us here against gRPC's 195, which is most of what a lone
// create, lookup or unlink waits for.

// wireSocketName is the lean path's Unix socket in the service's
// directory.
const wireSocketName = "meta.sock"

// WireIdentity is what the lean path's Unix socket answers: the cluster id
// and a random part new at every start, so that a client never takes
// another server (or this one restarted, at another address) for the one
// whose address it holds.
func (s *Service) WireIdentity() string {
	s.wireIDOnce.Do(func() { s.wireID = wire.NewIdentity(s.clusterID) })
	return s.wireID
}

// listenWire shares lis between gRPC and the lean path and adds the lean
// path's Unix socket. It returns the listener gRPC serves, the lean
// path's, and the address session answers name (the server's address
// with the Unix socket and its identity).
func (s *Service) listenWire(lis net.Listener) (grpcL, wireL net.Listener, addr string) {
	grpcL, wireL = wire.Split(lis, s.log)
	a := wire.Addr{TCP: lis.Addr().String()}
	switch {
	case s.cfg.Advertise != "":
		a.TCP = s.cfg.Advertise
	case s.cfg.HA != nil && s.cfg.HA.Advertise != "":
		a.TCP = s.cfg.HA.Advertise
	}
	if s.cfg.Dir == "" {
		return grpcL, wireL, a.String()
	}
	ul := wire.ListenUnix(filepath.Join(s.cfg.Dir, wireSocketName), "meta lean path", s.log)
	if ul == nil {
		return grpcL, wireL, a.String()
	}
	a.Unix, a.ID = ul.Addr().String(), s.WireIdentity()
	return grpcL, wire.ListenBoth(wireL, ul), a.String()
}

// wireAddress is the lean path's advertised address ("" before Serve).
func (s *Service) wireAddress() string {
	s.wireMu.Lock()
	defer s.wireMu.Unlock()
	return s.wireAddr
}
