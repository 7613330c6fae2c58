package meta

import (
	"net"
	"path/filepath"

	"github.com/weft-fs/weft/internal/wire"
)

// The meta service's lean path: batches of namespace calls (batch.go)
// over package wire's framing instead of gRPC, on TCP and, for clients on
// the same host, a Unix socket in the service's directory. A getattr's
// round trip costs 110-125 us here against gRPC's 195, which is most of
// what a lone create, lookup or unlink waits for. Clients learn the address from
// their session's answers and fall back to gRPC whenever it fails.

// WireOff as Config.WireListen turns the lean path off (gRPC only).
const WireOff = "off"

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

// listenWire opens the lean path's listeners next to the gRPC listener lis
// and returns them with the address to advertise; nil when it is off.
func (s *Service) listenWire(lis net.Listener) (net.Listener, string, error) {
	if s.cfg.WireListen == WireOff {
		return nil, "", nil
	}
	advertise := s.cfg.Advertise
	if advertise == "" && s.cfg.HA != nil {
		advertise = s.cfg.HA.Advertise
	}
	if advertise != "" && s.cfg.WireAdvertise == "" {
		s.log.Info("meta lean path off: an advertise address is set without a wire advertise address (clients use gRPC)",
			"advertise", advertise)
		return nil, "", nil
	}
	wl, err := wire.ListenTCP(lis.Addr(), s.cfg.WireListen, "meta lean path")
	if err != nil {
		return nil, "", err
	}
	a := wire.Addr{TCP: wl.Addr().String()}
	if s.cfg.WireAdvertise != "" {
		a.TCP = s.cfg.WireAdvertise
	}
	if s.cfg.Dir == "" {
		return wl, a.String(), nil
	}
	ul := wire.ListenUnix(filepath.Join(s.cfg.Dir, wireSocketName), "meta lean path", s.log)
	if ul == nil {
		return wl, a.String(), nil
	}
	a.Unix, a.ID = ul.Addr().String(), s.WireIdentity()
	return wire.ListenBoth(wl, ul), a.String(), nil
}

// wireAddress is the lean path's advertised address ("" if none).
func (s *Service) wireAddress() string {
	s.wireMu.Lock()
	defer s.wireMu.Unlock()
	return s.wireAddr
}
