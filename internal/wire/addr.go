package wire

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Addr is the address of a data server's lean data path as the server
// reports it: a TCP address, and optionally the path of a Unix domain
// socket the same server listens on, with the identity it answers there.
// A client on the same host reaches the server through the socket (no TCP
// stack on the way); a client elsewhere, or one that finds another server
// at that path (the same directory layout on another host, or a server
// restarted since), uses TCP.
//
// Its text form is the TCP address alone, or
//
//	TCP|unix=PATH|id=IDENTITY
type Addr struct {
	TCP  string
	Unix string // "" if none
	ID   string // identity the server at Unix answers with
}

// ParseAddr parses the text form of an Addr. Unknown fields are ignored;
// a Unix path without an identity is dropped (it could not be checked).
func ParseAddr(s string) Addr {
	parts := strings.Split(s, "|")
	a := Addr{TCP: parts[0]}
	for _, p := range parts[1:] {
		switch {
		case strings.HasPrefix(p, "unix="):
			a.Unix = p[len("unix="):]
		case strings.HasPrefix(p, "id="):
			a.ID = p[len("id="):]
		}
	}
	if a.Unix == "" || a.ID == "" {
		a.Unix, a.ID = "", ""
	}
	return a
}

// String is the text form of a.
func (a Addr) String() string {
	if a.Unix == "" || a.ID == "" {
		return a.TCP
	}
	return a.TCP + "|unix=" + a.Unix + "|id=" + a.ID
}

// prefaceID opens a connection whose client wants the server's identity:
// the server answers prefaceID, a u16 length and the identity.
var prefaceID = [8]byte{'w', 'e', 'f', 't', 'w', 'i', 'd', '1'}

// unixBuffer is the send buffer of a Unix socket connection (capped by
// net.core.wmem_max).
const unixBuffer = 4 << 20

// maxIdentity bounds an identity's length.
const maxIdentity = 256

// errNotThisServer means the Unix socket at the path is another server's.
var errNotThisServer = errors.New("another server listens at that path")

// Identified is implemented by a Handler that answers connections asking
// for its identity (see Addr). Without it the identity is empty and
// clients never use the Unix socket.
type Identified interface {
	WireIdentity() string
}

// NewIdentity returns an identity for a server known as base (its
// cluster id or uuid): base and a random part new at every call, so that
// a client never takes another server, or this one restarted at another
// address, for the one whose address it holds.
func NewIdentity(base string) string {
	var b [8]byte
	rand.Read(b[:])
	return base + "." + hex.EncodeToString(b[:])
}

// dialUnix connects to the Unix socket of a and checks that the server
// there has a's identity (errNotThisServer if not).
func dialUnix(ctx context.Context, peer string, a Addr) (*clientConn, error) {
	nc, err := dialUnixChecked(ctx, a)
	if err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return newClientConn(peer, a.Unix, nc), nil
}

// dialUnixChecked connects to the Unix socket of a and checks that the
// server there has a's identity: errNotThisServer if not. The
// connection's deadline is the dial's; the caller clears it.
func dialUnixChecked(ctx context.Context, a Addr) (*net.UnixConn, error) {
	fi, err := os.Stat(a.Unix)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("%s is not a socket: %w", a.Unix, errNotThisServer)
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "unix", a.Unix)
	if err != nil {
		return nil, err
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("%s: not a Unix socket connection", a.Unix)
	}
	uc.SetWriteBuffer(unixBuffer)
	if dl, ok := dctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	fail := func(err error) (*net.UnixConn, error) {
		nc.Close()
		return nil, err
	}
	if _, err := nc.Write(prefaceID[:]); err != nil {
		return fail(err)
	}
	var pre [10]byte
	if _, err := io.ReadFull(nc, pre[:]); err != nil {
		return fail(err)
	}
	n := int(le.Uint16(pre[8:]))
	if [8]byte(pre[:8]) != prefaceID || n > maxIdentity {
		return fail(errors.New("the server did not answer with the weft identity preface"))
	}
	id := make([]byte, n)
	if _, err := io.ReadFull(nc, id); err != nil {
		return fail(err)
	}
	if string(id) != a.ID {
		return fail(fmt.Errorf("%s: identity %q, want %q: %w", a.Unix, id, a.ID, errNotThisServer))
	}
	return uc, nil
}

// dialAddr connects to the server of c: through its Unix socket when it
// has one on this host that answers with its identity, else over TCP.
func (c *Client) dialAddr(ctx context.Context) (*clientConn, error) {
	if c.a.Unix != "" && !c.unixOff.Load() {
		cc, err := dialUnix(ctx, c.peer, c.a)
		if err == nil {
			c.unixConns.Add(1)
			return cc, nil
		}
		if errors.Is(err, errNotThisServer) {
			// Not the server we want: TCP from now on.
			c.unixOff.Store(true)
		}
	}
	return dial(ctx, c.peer, c.a.TCP)
}

// UnixConns is the number of connections made through the server's Unix
// socket so far.
func (c *Client) UnixConns() uint64 { return c.unixConns.Load() }
