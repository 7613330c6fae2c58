package wire

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// pipeListener hands out the server ends of net.Pipe connections.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn, 1), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// echoHandler answers every request at once (a read with at most 64 KiB
// of zeros) and every batch with no answers.
type echoHandler struct{}

func (echoHandler) WriteChunk(context.Context, *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	return &weftv1.WriteChunkResponse{}, nil
}

func (echoHandler) ReadChunk(_ context.Context, r *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
	return &weftv1.ReadChunkResponse{Data: make([]byte, min(r.GetLength(), 64<<10))}, nil
}

func (echoHandler) SyncFile(context.Context, *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
	return &weftv1.SyncFileResponse{}, nil
}

func (echoHandler) Batch(context.Context, *weftv1.BatchRequest) (*weftv1.BatchResponse, error) {
	return &weftv1.BatchResponse{}, nil
}

// frame builds a frame of op with meta fields and a payload.
func frame(op uint8, meta, payload []byte, id uint64) []byte {
	var h [headerLen]byte
	header{op: op, metaLen: len(meta), payloadLen: len(payload), id: id, timeoutMs: 1000}.put(h[:])
	return append(append(h[:], meta...), payload...)
}

// FuzzServerFrames feeds a chunk server and a meta batch server whatever
// a peer may send on a connection: each must answer or drop the
// connection, never panic or hang, and stop when closed.
func FuzzServerFrames(f *testing.F) {
	var wm [maxFixedMeta]byte
	putWrite(wm[:], &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 1}, ChunkSize: 1 << 20})
	f.Add(frame(opWriteChunk, wm[:writeMetaLen], []byte("data"), 1))
	var rm [maxFixedMeta]byte
	putRead(rm[:], &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 1}, Length: 100})
	f.Add(frame(opReadChunk, rm[:readMetaLen], nil, 2))
	f.Add(frame(opMetaBatch, nil, []byte{0x0a, 0x02, 0x08, 0x01}, 3))
	f.Add([]byte("weft"))
	f.Add(make([]byte, headerLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, s := range []*Server{NewServer(echoHandler{}, slog.New(slog.DiscardHandler)),
			NewBatchServer(echoHandler{}, slog.New(slog.DiscardHandler))} {
			l := newPipeListener()
			served := make(chan struct{})
			go func() { s.Serve(l); close(served) }()
			peer, conn := net.Pipe()
			l.conns <- conn
			go io.Copy(io.Discard, peer)
			peer.SetWriteDeadline(time.Now().Add(2 * time.Second))
			peer.Write(b)
			peer.Close()
			done := make(chan struct{})
			go func() { s.Close(time.Second); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the server did not stop after a peer sent %d bytes", len(b))
			}
			<-served
		}
	})
}

// FuzzClientAnswers answers a client's calls with whatever a server may
// send: each call must return (an error or an answer), never panic or
// hang.
func FuzzClientAnswers(f *testing.F) {
	f.Add(frame(opResponse, nil, nil, 1))
	f.Add(frame(opResponse, make([]byte, respMetaMin), []byte("x"), 1))
	f.Add(make([]byte, headerLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			for {
				nc, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer nc.Close()
					var h [headerLen]byte
					if _, err := io.ReadFull(nc, h[:]); err != nil {
						return
					}
					nc.SetWriteDeadline(time.Now().Add(time.Second))
					nc.Write(b)
				}()
			}
		}()
		c := NewClient(l.Addr().String(), 1)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		done := make(chan struct{})
		go func() {
			c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 1}, Length: 10})
			c.Batch(ctx, &weftv1.BatchRequest{})
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("a call did not return after the server answered %d bytes", len(b))
		}
	})
}

// FuzzParseAddr parses data server addresses as the chain table carries
// them.
func FuzzParseAddr(f *testing.F) {
	f.Add("127.0.0.1:7100|unix=/srv/weft/wire.sock|id=abc.def")
	f.Add("host:1")
	f.Add("|||unix=|id=")
	f.Fuzz(func(t *testing.T, s string) {
		a := ParseAddr(s)
		_ = a.String()
	})
}
