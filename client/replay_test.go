package client

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// sessionOpens returns how many opens the meta service records for the
// client's session.
func sessionOpens(t *testing.T, c *Client) int {
	t.Helper()
	st, err := c.Meta().Status(context.Background(), &weftv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.SessionList {
		if s.Id == c.Session() {
			return int(s.OpenFiles)
		}
	}
	t.Fatalf("session %s is not in the meta service's status", c.Session())
	return 0
}

// A meta service crash that loses the open records (they are committed
// lazily) does not lose an open file's data: a file another client
// unlinks in the grace period, before the client that has it open
// replayed its opens, stays readable by it after the grace period ended;
// one nobody has open is deleted when it ends.
func TestOpensReplayedAfterMetaCrash(t *testing.T) {
	const grace = 2 * time.Second
	tc := startClusterOpts(t, &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}, 1,
		clusterOpts{sessionLease: 1500 * time.Millisecond, openGrace: grace})
	ctx := context.Background()
	a := newTestClient(t, tc.metaAddr, Config{})
	b := newTestClient(t, tc.metaAddr, Config{})
	data := bytes.Repeat([]byte("replayed open "), 100_000)
	for _, name := range []string{"kept", "gone"} {
		f := create(t, a, name, syscall.O_RDWR)
		if _, err := f.WriteAt(ctx, data, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.ReleaseNow(ctx); err != nil { // its open record gone before the counts below
			t.Fatal(err)
		}
	}
	kept, _ := open(t, a, "kept", syscall.O_RDONLY)
	defer kept.Release(ctx)
	twice, _ := open(t, a, "kept", syscall.O_RDONLY)
	defer twice.Release(ctx)
	if got := sessionOpens(t, a); got != 1 || a.OpenFiles() != 2 {
		t.Fatalf("before the crash: %d files open in the session, %d opens counted by the client; want 1 and 2", got, a.OpenFiles())
	}

	if n := tc.CrashMeta(); n == 0 {
		t.Fatal("the crash dropped no open record")
	}
	crashed := time.Now()
	// Unlinked at once, most likely before the client replays (it renews
	// every half second): the grace period keeps the file meanwhile.
	for _, name := range []string{"kept", "gone"} {
		if err := b.Unlink(ctx, root, 1, name); err != nil {
			t.Fatal(err)
		}
	}
	if sessionOpens(t, a) != 0 {
		t.Log("the client replayed before the unlinks")
	}
	deadline := time.Now().Add(10 * time.Second)
	for sessionOpens(t, a) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the client did not replay its open file after the meta service's crash")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if time.Since(crashed) >= grace {
		t.Skip("the replay came after the grace period (machine too slow)")
	}
	time.Sleep(grace - time.Since(crashed) + 500*time.Millisecond)
	// The sweep at the grace period's end deleted "gone" (nobody has it
	// open): its chunks go, and the GC queue empties.
	deadline = time.Now().Add(10 * time.Second)
	for {
		st, err := a.Meta().Status(ctx, &weftv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.GcPending == 0 && st.Files == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the grace period: %d files, %d waiting for GC; want 1 (the open one) and 0", st.Files, st.GcPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := make([]byte, len(data))
	if _, err := kept.ReadAt(ctx, got, 0); err != nil {
		t.Fatalf("read the open, unlinked file after the grace period: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the open, unlinked file reads other bytes than written")
	}
}
