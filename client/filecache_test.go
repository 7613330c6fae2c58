package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/perm"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestFileAttrsKeptUnderCallbacks checks the attributes of regular files
// kept under callbacks: after the kernel forgot a file, a lookup and a
// getattr of it are answered without a call; another client's append,
// chmod and unlink reach the kept attributes by callback; this client's
// own change drops them; a lookup made without this client's session
// (no callbacks promised) is not kept.
func TestFileAttrsKeptUnderCallbacks(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}
	tc := startCluster(t, layout, 1)
	ctx := context.Background()
	a := newTestClient(t, tc.metaAddr, Config{OnInvalidate: func(*weftv1.Invalidation) {}, Testing: Testing{NoDelegations: true}})
	b := newTestClient(t, tc.metaAddr, Config{})
	deadline := time.Now().Add(10 * time.Second)
	for !a.CallbacksLive() {
		if time.Now().After(deadline) {
			t.Fatal("callbacks not live after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	writeFile(t, b, "f", []byte("hello"))
	caller := sessionCaller(a)

	// Without the session, nothing is kept.
	if _, err := a.Lookup(ctx, root, 1, "f"); err != nil {
		t.Fatal(err)
	}
	calls := a.MetaCalls()
	if _, err := a.Lookup(ctx, root, 1, "f"); err != nil {
		t.Fatal(err)
	}
	if a.MetaCalls() == calls {
		t.Fatal("a lookup without the session was answered from kept attributes (no callbacks were promised for it)")
	}

	at, err := a.Lookup(ctx, caller, 1, "f")
	if err != nil {
		t.Fatal(err)
	}
	a.Forget(at.Ino) // as the kernel does after a page-cache drop
	calls, hits := a.MetaCalls(), a.FileAttrHits()
	got, err := a.Lookup(ctx, caller, 1, "f")
	if err != nil {
		t.Fatal(err)
	}
	g, err := a.GetAttr(ctx, at.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if a.MetaCalls() != calls || a.FileAttrHits() != hits+2 {
		t.Fatalf("lookup and getattr of a kept file: %d meta calls, %d answered here; want none and 2",
			a.MetaCalls()-calls, a.FileAttrHits()-hits)
	}
	if got.Size != 5 || got.Ino != at.Ino || g.Size != 5 {
		t.Fatalf("kept attributes: size %d ino %d (getattr size %d), want 5 and %d", got.Size, got.Ino, g.Size, at.Ino)
	}

	// waitFor polls a's lookup of f until ok accepts it.
	waitFor := func(what string, ok func(*weftv1.Attr, error) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			at, err := a.Lookup(ctx, caller, 1, "f")
			if ok(at, err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: a's lookup still gives %v, %v", what, at, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Another client's append.
	f, _ := open(t, b, "f", syscall.O_WRONLY)
	if _, err := f.WriteAt(ctx, []byte(" world"), 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("another client's append", func(at *weftv1.Attr, err error) bool { return err == nil && at.Size == 11 })
	// Another client's chmod.
	if _, err := b.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: root, Ino: at.Ino, Valid: perm.SetMode, Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	waitFor("another client's chmod", func(at *weftv1.Attr, err error) bool { return err == nil && at.Mode&0o7777 == 0o600 })

	// This client's own change (no callback comes for it). The kernel
	// had forgotten the file: its Forget goes once the entry is dropped.
	var released []uint64
	a.dirs.mu.Lock()
	release := a.dirs.release
	a.dirs.release = func(inos ...uint64) {
		released = append(released, inos...) // under a.dirs.mu
		release(inos...)
	}
	a.dirs.mu.Unlock()
	if _, err := a.Lookup(ctx, caller, 1, "f"); err != nil {
		t.Fatal(err)
	}
	a.Forget(at.Ino)
	a.dirs.mu.Lock()
	early := len(released)
	a.dirs.mu.Unlock()
	if _, err := a.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: caller, Ino: at.Ino, Valid: perm.SetMode, Mode: 0o640}); err != nil {
		t.Fatal(err)
	}
	a.dirs.mu.Lock()
	late := slices.Clone(released)
	a.dirs.mu.Unlock()
	if early != 0 || !slices.Equal(late, []uint64{at.Ino}) {
		t.Fatalf("Forgets released: %d while the file was kept, %v once it was dropped; want none, then [%d]", early, late, at.Ino)
	}
	if got, err := a.Lookup(ctx, caller, 1, "f"); err != nil || got.Mode&0o7777 != 0o640 {
		t.Fatalf("after this client's chmod: mode %o, err %v; want 640", got.GetMode()&0o7777, err)
	}

	// This client's own append (committed at its close).
	if _, err := a.Lookup(ctx, caller, 1, "f"); err != nil {
		t.Fatal(err)
	}
	f, _, err = a.Open(ctx, caller, at.Ino, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, []byte("!"), 11); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Lookup(ctx, caller, 1, "f"); err != nil || got.Size != 12 {
		t.Fatalf("after this client's append: size %d, err %v; want 12", got.GetSize(), err)
	}

	// A listing with attributes (READDIRPLUS) keeps them too.
	// (A callback about b's create and commit of g may still reach a after
	// its listing and drop what it kept; the next listing keeps it.)
	writeFile(t, b, "g", []byte("listed"))
	for try := 1; ; try++ {
		if _, _, err := a.ReadDir(ctx, caller, 1, "", true); err != nil {
			t.Fatal(err)
		}
		calls = a.MetaCalls()
		g, err := a.Lookup(ctx, caller, 1, "g")
		if err == nil && g.Size == 6 && a.MetaCalls() == calls {
			break
		}
		if try == 3 {
			t.Fatalf("lookup of a file listed with its attributes: size %d, err %v, %d meta calls; want 6 and none",
				g.GetSize(), err, a.MetaCalls()-calls)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Another client's unlink.
	if err := b.Unlink(ctx, root, 1, "f"); err != nil {
		t.Fatal(err)
	}
	waitFor("another client's unlink", func(_ *weftv1.Attr, err error) bool { return errors.Is(err, syscall.ENOENT) })
}

// TestFileCacheBoundAndRelease checks the kept files' bookkeeping on its
// own: at most maxCachedFiles are kept; a lookup started before a change
// of this client is not kept; dropping them all releases, in one call,
// the Forgets of exactly those the kernel forgot (and had not got back).
func TestFileCacheBoundAndRelease(t *testing.T) {
	var d dirCache
	var released []uint64
	d.release = func(inos ...uint64) { released = append(released, inos...) }
	file := func(ino uint64) *weftv1.Attr {
		return &weftv1.Attr{Ino: ino, Mode: syscall.S_IFREG | 0o644, Size: ino}
	}
	tok, gen := d.token(), d.fileGeneration()
	for ino := uint64(2); ino < 2+maxCachedFiles+100; ino++ {
		d.putFile(1, fmt.Sprint("f", ino), file(ino), tok, gen)
	}
	if n := len(d.files); n != maxCachedFiles || len(d.entries) != n {
		t.Fatalf("%d files and %d entries kept, want %d of each", n, len(d.entries), maxCachedFiles)
	}
	d.dropFiles()
	released = nil
	d.putFile(1, "a", file(10), tok, gen) // started before the drop
	if d.file(1, "a") != nil {
		t.Fatal("a lookup started before this client's change was kept")
	}
	tok, gen = d.token(), d.fileGeneration()
	for ino := uint64(10); ino < 13; ino++ {
		d.putFile(1, fmt.Sprint("f", ino), file(ino), tok, gen)
	}
	d.putFile(1, "dir", &weftv1.Attr{Ino: 20, Mode: syscall.S_IFDIR | 0o755}, tok, gen)
	if d.fileAttr(20) != nil {
		t.Fatal("a directory was kept among the files")
	}
	for _, ino := range []uint64{10, 11, 99} {
		if got, want := d.forgetFile(ino), ino != 99; got != want {
			t.Fatalf("forgetFile(%d) = %v, want %v", ino, got, want)
		}
	}
	d.held(11) // handed to the kernel again
	if a := d.file(1, "f12"); a == nil || a.Size != 12 {
		t.Fatalf("kept file f12: %v", a)
	}
	if len(released) != 0 {
		t.Fatalf("released %v before the drop", released)
	}
	d.dropFiles()
	if !slices.Equal(released, []uint64{10}) {
		t.Fatalf("released %v, want [10] (11 is held again, 12 never forgotten)", released)
	}
	if d.fileAttr(10) != nil || d.file(1, "f11") != nil {
		t.Fatal("files still kept after the drop")
	}
}
