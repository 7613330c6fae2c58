package meta

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// requestCtx is a context as the HA interceptor makes it for a request
// carrying request id id.
func requestCtx(id string) context.Context {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(mdRequestID, id))
	return withRequestToken(ctx)
}

// TestRequestAppliedOnce: a namespace operation sent again with the same
// request id (a client retrying on another meta server after the first
// try was cut off) changes nothing the second time and is answered
// "already applied"; other ids and requests without one are unaffected;
// old records are swept.
func TestRequestAppliedOnce(t *testing.T) {
	e := newEnv(t)
	id := fmt.Sprintf("%016x-abc", uint64(time.Now().UnixNano()))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		dir  string
		want codes.Code
	}{
		{"first", requestCtx(id), "d", codes.OK},
		{"same id again", requestCtx(id), "d2", codes.Aborted},
		{"other id", requestCtx(fmt.Sprintf("%016x-def", uint64(time.Now().UnixNano()))), "d3", codes.OK},
		{"no id", context.Background(), "d4", codes.OK},
		{"malformed id", requestCtx("x/y"), "d5", codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.s.Mkdir(tc.ctx, &weftv1.MkdirRequest{Parent: rootIno, Name: tc.dir, Mode: 0o755})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("Mkdir %s: %v, want code %v", tc.dir, err, tc.want)
			}
			_, lerr := e.lookup(nil, rootIno, tc.dir)
			if exists := lerr == nil; exists != (tc.want == codes.OK) {
				t.Errorf("after Mkdir %s (%v): exists %v", tc.dir, err, exists)
			}
		})
	}
	if err := e.s.sweepRequests(context.Background(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Mkdir(requestCtx(id), &weftv1.MkdirRequest{Parent: rootIno, Name: "d6", Mode: 0o755}); err != nil {
		t.Errorf("Mkdir with a swept request id: %v", err)
	}
}
