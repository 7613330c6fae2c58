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

// gateBatches is a BatchHandler whose "Wait" calls block until a "Go"
// call came (or a second passed), telling the lean path first with
// WillBlock unless quiet; every batch is quick.
type gateBatches struct {
	quiet   bool
	opened  chan struct{}
	waiting chan struct{}
}

func (g *gateBatches) QuickBatch(*weftv1.BatchRequest) bool { return true }

func (g *gateBatches) Batch(ctx context.Context, req *weftv1.BatchRequest) (*weftv1.BatchResponse, error) {
	resp := &weftv1.BatchResponse{}
	for _, c := range req.Calls {
		switch c.Method {
		case "Wait":
			if !g.quiet {
				WillBlock(ctx)
			}
			close(g.waiting)
			select {
			case <-g.opened:
			case <-time.After(time.Second):
				return nil, status.Error(codes.DeadlineExceeded, "the Go call never came")
			}
		case "Go":
			close(g.opened)
		}
		resp.Replies = append(resp.Replies, &weftv1.BatchReply{})
	}
	return resp, nil
}

// A quick batch is served on the goroutine reading its connection; one
// that is about to wait says so (WillBlock), and the connection is read
// on meanwhile: the call it waits for, sent on the same connection after
// it, gets through. Without WillBlock it waits out its second.
func TestQuickBatchThatWaitsHandsOffReading(t *testing.T) {
	for _, tt := range []struct {
		name   string
		quiet  bool
		wantOK bool
	}{
		{"says it waits", false, true},
		{"does not say it", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := &gateBatches{quiet: tt.quiet, opened: make(chan struct{}), waiting: make(chan struct{})}
			c := NewMetaClient(serveBatches(t, g, "meta-gate"))
			ctx := context.Background()
			waited := make(chan error, 1)
			go func() {
				_, err := c.Batch(ctx, &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{{Method: "Wait"}}})
				waited <- err
			}()
			<-g.waiting
			goDone := make(chan error, 1)
			go func() {
				_, err := c.Batch(ctx, &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{{Method: "Go"}}})
				goDone <- err
			}()
			err := <-waited
			if (err == nil) != tt.wantOK {
				t.Fatalf("the waiting call: %v, want it answered: %v", err, tt.wantOK)
			}
			if err := <-goDone; err != nil {
				t.Fatalf("the call it waited for: %v", err)
			}
			// The connection still serves quick batches in turn.
			for range 3 {
				if _, err := c.Batch(ctx, &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{{Method: "Lookup"}}}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
