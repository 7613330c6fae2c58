package wire

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestParseAddr(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Addr
		str  string
	}{
		{"127.0.0.1:5000", Addr{TCP: "127.0.0.1:5000"}, "127.0.0.1:5000"},
		{"h:1|unix=/d/wire.sock|id=abc", Addr{TCP: "h:1", Unix: "/d/wire.sock", ID: "abc"}, "h:1|unix=/d/wire.sock|id=abc"},
		{"h:1|unix=/d/wire.sock", Addr{TCP: "h:1"}, "h:1"}, // no identity: no socket
		{"h:1|id=abc|later=x", Addr{TCP: "h:1"}, "h:1"},    // no socket
		{"h:1|later=x|id=i|unix=/s", Addr{TCP: "h:1", Unix: "/s", ID: "i"}, "h:1|unix=/s|id=i"},
	} {
		got := ParseAddr(tc.in)
		if got != tc.want || got.String() != tc.str {
			t.Errorf("ParseAddr(%q) = %+v (%q), want %+v (%q)", tc.in, got, got.String(), tc.want, tc.str)
		}
	}
}

// idHandler is a Handler with an identity that answers reads with its name.
type idHandler struct {
	id, name string
}

func (h *idHandler) WireIdentity() string { return h.id }

func (h *idHandler) WriteChunk(context.Context, *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	return &weftv1.WriteChunkResponse{}, nil
}

func (h *idHandler) ReadChunk(context.Context, *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
	return &weftv1.ReadChunkResponse{Data: []byte(h.name)}, nil
}

func (h *idHandler) SyncFile(context.Context, *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
	return &weftv1.SyncFileResponse{}, nil
}

// serveBoth serves h on a loopback TCP port and, if sock is set, on a Unix
// socket there; it returns the TCP address.
func serveBoth(t *testing.T, h Handler, sock string) string {
	t.Helper()
	s := NewServer(h, slog.New(slog.DiscardHandler))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	if sock != "" {
		ul, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve(ul)
	}
	t.Cleanup(func() { s.Close(time.Second) })
	return l.Addr().String()
}

// socketDir is a directory short enough for Unix socket paths.
func socketDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "wire")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func readName(t *testing.T, c *Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data, err := c.ReadChunkInto(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 1}, Length: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A client of a server on the same host goes through its Unix socket.
func TestUnixSocketOfLocalServer(t *testing.T) {
	sock := filepath.Join(socketDir(t), "wire.sock")
	tcp := serveBoth(t, &idHandler{id: "server-a", name: "a"}, sock)
	c := NewClient(Addr{TCP: tcp, Unix: sock, ID: "server-a"}.String(), 2)
	defer c.Close()
	for range 4 {
		if got := readName(t, c); got != "a" {
			t.Fatalf("read from %q, want a", got)
		}
	}
	if n := c.UnixConns(); n == 0 {
		t.Fatal("no connection went through the Unix socket")
	}
}

// A client whose server's socket path holds another server (the same
// layout on another host) uses TCP, and reaches the right server.
func TestUnixSocketOfAnotherServer(t *testing.T) {
	sock := filepath.Join(socketDir(t), "wire.sock")
	serveBoth(t, &idHandler{id: "server-b", name: "b"}, sock) // the local one at the path
	tcpA := serveBoth(t, &idHandler{id: "server-a", name: "a"}, "")
	c := NewClient(Addr{TCP: tcpA, Unix: sock, ID: "server-a"}.String(), 2)
	defer c.Close()
	for range 4 {
		if got := readName(t, c); got != "a" {
			t.Fatalf("read from %q, want a", got)
		}
	}
	if n := c.UnixConns(); n != 0 {
		t.Fatalf("%d connections through another server's Unix socket", n)
	}
	// A path that does not exist here, or is no socket: TCP as well.
	for _, p := range []string{filepath.Join(socketDir(t), "none.sock"), os.Args[0]} {
		c := NewClient(Addr{TCP: tcpA, Unix: p, ID: "server-a"}.String(), 1)
		if got := readName(t, c); got != "a" {
			t.Fatalf("read from %q, want a", got)
		}
		if c.UnixConns() != 0 {
			t.Fatalf("connection through %s", p)
		}
		c.Close()
	}
}
