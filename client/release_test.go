package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// chunkFiles counts the chunk files on the cluster's data servers.
func chunkFiles(t *testing.T, tc *testCluster) int {
	t.Helper()
	n := 0
	for _, d := range tc.dataDirs {
		_ = filepath.WalkDir(filepath.Join(d, "chunks"), func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
				n++
			}
			return nil
		})
	}
	return n
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after 20s", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReleaseInBackground checks the meta release sent after Release
// returns: a file unlinked right after its close still has its chunks
// deleted once the release lands, and Close sends every queued release
// before it ends the session.
func TestReleaseInBackground(t *testing.T) {
	tc := startCluster(t, smallStripes(), 3)
	ctx := context.Background()

	t.Run("unlink after close frees the chunks", func(t *testing.T) {
		c := newTestClient(t, tc.metaAddr, Config{})
		base := chunkFiles(t, tc)
		f := create(t, c, "gone", syscall.O_WRONLY)
		if _, err := f.WriteAt(ctx, make([]byte, 300<<10), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Unlink(ctx, root, 1, "gone"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "inode of the unlinked file removed", func() error {
			if _, err := c.GetAttr(ctx, f.Ino()); err == nil {
				return errors.New("still there")
			}
			return nil
		})
		waitFor(t, "chunks of the unlinked file deleted", func() error {
			if n := chunkFiles(t, tc); n > base {
				return errors.New("chunk files left")
			}
			return nil
		})
	})

	t.Run("close drains releases", func(t *testing.T) {
		c := newTestClient(t, tc.metaAddr, Config{})
		const n = 200
		before, released := c.MetaCalls(), c.ReleasesSent()
		for i := range n {
			f, _, err := c.Create(ctx, root, 1, "drain-"+itoa(i), 0o644, syscall.O_WRONLY, true)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if p := c.PendingReleases(); p != 0 {
			t.Errorf("%d releases left after Close", p)
		}
		if got := c.ReleasesSent() - released; got != n {
			t.Errorf("%d files released by Close, want %d", got, n)
		}
		if calls := c.MetaCalls() - before; calls < n+1 || calls > 2*n {
			t.Errorf("%d meta calls for %d creates and releases, want %d to %d (releases queued together share a call)", calls, n, n+1, 2*n)
		}
	})

	t.Run("meta restart meanwhile", func(t *testing.T) {
		c := newTestClient(t, tc.metaAddr, Config{UnavailableTimeout: 30 * time.Second})
		f := create(t, c, "restart", syscall.O_WRONLY)
		if _, err := f.WriteAt(ctx, []byte("data"), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		tc.stopMeta()
		if err := f.Release(ctx); err != nil {
			t.Fatalf("release while the meta service is down: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
		if c.PendingReleases() == 0 {
			t.Fatal("release sent while the meta service was down")
		}
		tc.startMeta()
		waitFor(t, "release sent after the restart", func() error {
			if c.PendingReleases() != 0 {
				return errors.New("pending")
			}
			return nil
		})
		// The release landed: unlinking now deletes the inode at once.
		if err := c.Unlink(ctx, root, 1, "restart"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetAttr(ctx, f.Ino()); err == nil {
			t.Error("unlinked file still there: its open record was not released")
		}
	})
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// The background releaser sends the queued releases of one session
// together, keeping the queue's order and other sessions' releases.
func TestReleaseBatches(t *testing.T) {
	q := func(session string, ino uint64) *weftv1.ReleaseRequest {
		return &weftv1.ReleaseRequest{Ino: ino, Session: session}
	}
	many := func(n int) []*weftv1.ReleaseRequest {
		var rs []*weftv1.ReleaseRequest
		for i := range n {
			rs = append(rs, q("s", uint64(i+1)))
		}
		return rs
	}
	tests := []struct {
		name     string
		queue    []*weftv1.ReleaseRequest
		wantIno  uint64
		wantMore int
		wantLeft int
	}{
		{"one", many(1), 1, 0, 0},
		{"one session", many(10), 1, 9, 0},
		{"other sessions stay", []*weftv1.ReleaseRequest{q("a", 1), q("b", 2), q("a", 3), q("b", 4)}, 1, 1, 2},
		{"at most a batch", many(releaseBatch + 5), 1, releaseBatch - 1, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &releaser{queue: tt.queue}
			req := r.takeBatchLocked()
			if req.Ino != tt.wantIno || len(req.MoreInos) != tt.wantMore || len(r.queue) != tt.wantLeft {
				t.Fatalf("batch ino %d with %d more, %d left; want %d, %d, %d", req.Ino, len(req.MoreInos), len(r.queue), tt.wantIno, tt.wantMore, tt.wantLeft)
			}
			for _, left := range r.queue {
				if left == nil || (left.Session == req.Session && len(req.MoreInos) < releaseBatch-1) {
					t.Fatalf("queue left %v", r.queue)
				}
			}
		})
	}
}

// Files opened and closed one after another have their releases sent
// together: a worker lingers briefly for more before it sends.
func TestReleasesOfSuccessiveClosesGoTogether(t *testing.T) {
	tc := startCluster(t, smallStripes(), 1)
	ctx := context.Background()
	c := newTestClient(t, tc.metaAddr, Config{})
	const n = 20
	inos := make([]uint64, n)
	for i := range inos {
		f := create(t, c, "f"+itoa(i), syscall.O_WRONLY)
		inos[i] = f.Ino()
		if err := f.ReleaseNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Long enough that the opens in between fit, however loaded the
	// machine running the test is.
	c.rel.mu.Lock()
	c.rel.linger = 500 * time.Millisecond
	c.rel.mu.Unlock()
	sent, calls := c.ReleasesSent(), c.MetaCalls()
	for _, ino := range inos {
		f, _, err := c.Open(ctx, root, ino, syscall.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every release sent", func() error {
		if got := c.ReleasesSent() - sent; got < n {
			return fmt.Errorf("%d of %d sent", got, n)
		}
		return nil
	})
	if releases := c.MetaCalls() - calls - n; releases > 2 {
		t.Errorf("%d release calls for %d files closed one after another, want at most 2", releases, n)
	}
}
