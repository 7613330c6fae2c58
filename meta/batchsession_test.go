package meta

import (
	"context"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestBatchCallSession checks that a batched GetAttr runs in the session
// its request names: the holder of a directory's delegation reading it
// does not recall it; a call of no session does.
func TestBatchCallSession(t *testing.T) {
	ctx := context.Background()
	s := openService(t, nil, startChunkServer(t))
	s.recallWait = 300 * time.Millisecond
	m := serveMeta(t, s)
	a := watch(t, m)
	d, err := m.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: rootIno, Name: "d", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: a.caller, Dir: d.Attr.Ino}); err != nil || !g.Granted {
		t.Fatalf("delegate: %v %v", g, err)
	}
	for _, tt := range []struct {
		name    string
		session string
		recalls uint64
	}{
		{"the holder's", a.session, 0},
		{"no session", "", 1},
	} {
		call := batchCall(t, "GetAttr", &weftv1.GetAttrRequest{Ino: d.Attr.Ino, Session: tt.session})
		before := s.deleg.recalled.Load()
		resp, err := s.Batch(ctx, &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{call}})
		if err != nil {
			t.Fatal(err)
		}
		var attr weftv1.AttrResponse
		if err := batchOutcome(t, resp.Replies[0], &attr); err != nil || attr.Attr.GetIno() != d.Attr.Ino {
			t.Fatalf("%s: getattr %v, %v", tt.name, attr.Attr, err)
		}
		if got := s.deleg.recalled.Load() - before; got != tt.recalls {
			t.Errorf("%s: %d recalls, want %d", tt.name, got, tt.recalls)
		}
	}
}
