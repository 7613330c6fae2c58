package data

import (
	"net"
	"path/filepath"

	"github.com/weft-fs/weft/internal/wire"
)

// wireSocketName is the lean data path's Unix socket in the server's
// directory, for clients and peers on the same host.
const wireSocketName = "wire.sock"

// WireIdentity is the identity the lean data path answers on its Unix
// socket: the server's incarnation (its UUID and a random part new at
// every start), so that a client never mistakes another server (or this
// one restarted) for the one whose address it holds.
func (s *Server) WireIdentity() string { return s.incarnation }

// Incarnation is this process's incarnation of the server, as registered
// with the meta service.
func (s *Server) Incarnation() string { return s.incarnation }

// withUnix adds the Unix socket to the lean data path's listener wl and
// its address to the reported address addr, if there is one.
func (s *Server) withUnix(wl net.Listener, addr string) (net.Listener, string) {
	ul := wire.ListenUnix(filepath.Join(s.cfg.Dir, wireSocketName), "lean data path", s.log)
	if ul == nil {
		return wl, addr
	}
	a := wire.Addr{TCP: addr, Unix: ul.Addr().String(), ID: s.WireIdentity()}
	return wire.ListenBoth(wl, ul), a.String()
}
