package wire

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// echoBatches is a BatchHandler that answers each call with its own
// request bytes, and fails batches without calls.
type echoBatches struct{ id string }

func (e *echoBatches) WireIdentity() string { return e.id }

func (e *echoBatches) Batch(_ context.Context, req *weftv1.BatchRequest) (*weftv1.BatchResponse, error) {
	if len(req.Calls) == 0 {
		return nil, status.Error(codes.InvalidArgument, "empty batch")
	}
	resp := &weftv1.BatchResponse{}
	for _, c := range req.Calls {
		resp.Replies = append(resp.Replies, &weftv1.BatchReply{Response: append([]byte(c.Method+":"), c.Request...)})
	}
	return resp, nil
}

// serveBatches serves b on loopback TCP and on a Unix socket and returns
// the lean address.
func serveBatches(t *testing.T, b BatchHandler, id string) string {
	t.Helper()
	s := NewBatchServer(b, slog.New(slog.DiscardHandler))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(socketDir(t), "meta.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ListenBoth(l, ul))
	t.Cleanup(func() { s.Close(time.Second) })
	return Addr{TCP: l.Addr().String(), Unix: sock, ID: id}.String()
}

// TestMetaBatch sends batches to a meta server's lean path, over its Unix
// socket and over TCP: answers come back in order, errors as statuses,
// and chunk requests are refused without breaking the connection.
func TestMetaBatch(t *testing.T) {
	addr := serveBatches(t, &echoBatches{id: "meta-1"}, "meta-1")
	for _, a := range []string{addr, ParseAddr(addr).TCP} {
		c := NewMetaClient(a)
		ctx := context.Background()
		req := &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{
			{Method: "Create", Request: []byte("one")},
			{Method: "Lookup", Request: make([]byte, 100_000)},
		}}
		for range 3 {
			resp, err := c.Batch(ctx, req)
			if err != nil {
				t.Fatalf("batch to %s: %v", a, err)
			}
			if len(resp.Replies) != 2 || string(resp.Replies[0].Response) != "Create:one" || len(resp.Replies[1].Response) != len("Lookup:")+100_000 {
				t.Fatalf("batch to %s answered %d replies (%.20q)", a, len(resp.Replies), resp.Replies)
			}
		}
		if _, err := c.Batch(ctx, &weftv1.BatchRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("empty batch: %v, want the handler's InvalidArgument", err)
		}
		if _, err := c.SyncFile(ctx, &weftv1.SyncFileRequest{Ino: 1}); status.Code(err) != codes.Unimplemented {
			t.Errorf("chunk sync to a meta server: %v, want Unimplemented", err)
		}
		if _, err := c.Batch(ctx, req); err != nil {
			t.Errorf("batch after a refused request: %v", err)
		}
		if a == addr && c.UnixConns() == 0 {
			t.Error("the client of a meta server on this host did not use its Unix socket")
		}
		c.Close()
	}
}

// TestMetaBatchRefused: a data server refuses batches (Unimplemented), and
// a batch to an address nobody listens at fails as never sent.
func TestMetaBatchRefused(t *testing.T) {
	tcp := serveBoth(t, &idHandler{id: "data-1", name: "d"}, "")
	c := NewMetaClient(tcp)
	defer c.Close()
	req := &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{{Method: "GetAttr"}}}
	if _, err := c.Batch(context.Background(), req); status.Code(err) != codes.Unimplemented {
		t.Errorf("batch to a data server: %v, want Unimplemented", err)
	}
	if got := readName(t, NewClient(tcp, 1)); got != "d" {
		t.Errorf("the data server answered %q after the refused batch", got)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	d := NewMetaClient(dead)
	defer d.Close()
	_, err = d.Batch(context.Background(), req)
	if !errors.Is(err, ErrNotSent) || status.Code(err) != codes.Unavailable {
		t.Errorf("batch to a dead address: %v, want Unavailable and ErrNotSent", err)
	}
}
